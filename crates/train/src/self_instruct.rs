//! Training prompts written by the target itself (self-instruct), for the
//! evaluation domains that have no offline training set: open chat
//! (MT-Bench), competition-style math (MATH-500) and function-writing code
//! tasks (HumanEval / MBPP). For every pair of a seed topic and a kind of
//! request of a [`Domain`], the target continues a short document listing
//! such requests; the continuation is sampled (T > 0, seeded), cleaned,
//! de-duplicated and kept only when it shares no long word run with any
//! evaluation prompt.
//!
//! Method: Wang et al., "Self-Instruct: Aligning Language Models with
//! Self-Generated Instructions" (ACL 2023), §2: a model writes new
//! instructions from a seed pool and near-duplicates are filtered. Here the
//! seed pool is a list of topics and request kinds per domain, written for
//! this project ([`Domain::topics`], [`Domain::kinds`]) rather than seed
//! tasks, and the filter is word 3-gram Jaccard similarity instead of
//! ROUGE-L.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use bastion_decode::{LoadedPair, Sampler};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

use crate::seeds::SIGNATURE_EXAMPLES;
pub use crate::seeds::{CODE_KINDS, CODE_TOPICS, KINDS, MATH_KINDS, MATH_TOPICS, TOPICS};

/// A domain of self-instruct prompts: its seed lists, the document the
/// target continues, and where its prompts are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    /// Open chat requests (MT-Bench's domain).
    Chat,
    /// Competition-style math problems (MATH-500's domain).
    Math,
    /// Function-writing programming tasks (HumanEval / MBPP's domain).
    Code,
}

impl Domain {
    /// Every domain.
    pub const ALL: [Domain; 3] = [Domain::Chat, Domain::Math, Domain::Code];

    /// Its name on the command line: `chat`, `math`, `code`.
    pub fn name(self) -> &'static str {
        match self {
            Domain::Chat => "chat",
            Domain::Math => "math",
            Domain::Code => "code",
        }
    }

    /// The prefix of its prompt ids (`chat-self:<n>`, …).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Domain::Chat => "chat-self",
            Domain::Math => "math-self",
            Domain::Code => "code-self",
        }
    }

    /// Its prompt file, relative to the dataset folder
    /// (`bastion_data::SELF_INSTRUCT_FILES` lists the same).
    pub fn file(self) -> &'static str {
        match self {
            Domain::Chat => "train/chat-self-instruct.jsonl",
            Domain::Math => "train/math-self-instruct.jsonl",
            Domain::Code => "train/code-self-instruct.jsonl",
        }
    }

    /// Seed topics.
    pub fn topics(self) -> &'static [&'static str] {
        match self {
            Domain::Chat => TOPICS,
            Domain::Math => MATH_TOPICS,
            Domain::Code => CODE_TOPICS,
        }
    }

    /// Kinds of request, `(label, opening words)`.
    pub fn kinds(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Domain::Chat => KINDS,
            Domain::Math => MATH_KINDS,
            Domain::Code => CODE_KINDS,
        }
    }

    /// The text the target continues for one (topic, opening words) pair: a
    /// plain document (no chat template) listing requests on the topic,
    /// ending with the opening words of the next one. For the one-line
    /// kinds the first line of the continuation completes the request; for
    /// the code `signature` kind the continuation completes a Python
    /// function header and its docstring.
    pub fn instruction(self, topic: &str, opening: &str) -> String {
        match self {
            Domain::Chat => {
                format!("Messages that users sent to a helpful AI assistant about {topic}, one per line:\n- {opening}")
            }
            Domain::Math => format!("Problems from mathematics competitions about {topic}, one per line:\n- {opening}"),
            Domain::Code if opening == "def " => {
                // One worked header shows the layout (a 135M target writes no docstring
                // without one); which one depends on the topic, so the copies vary.
                let example = SIGNATURE_EXAMPLES[topic.len() % SIGNATURE_EXAMPLES.len()];
                format!(
                    "# Python exercises about {topic}. Each function has a docstring that says what it must \
                     return.\n\n{example}\n\n\n{opening}"
                )
            }
            Domain::Code => format!("Python programming exercises about {topic}, one per line:\n- {opening}"),
        }
    }

    /// Whether a request of kind `opening` is a Python function header with
    /// a docstring rather than one line.
    fn is_signature(self, opening: &str) -> bool {
        self == Domain::Code && opening == "def "
    }
}

impl std::str::FromStr for Domain {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Domain::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown self-instruct domain `{s}`; expected one of: chat, math, code"))
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The chat domain's document (kept for the existing chat prompt file):
/// [`Domain::instruction`] of [`Domain::Chat`].
pub fn instruction(topic: &str, opening: &str) -> String {
    Domain::Chat.instruction(topic, opening)
}

/// One prompt of a self-instruct file (`datasets/train/*-self-instruct.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatPrompt {
    /// Stable id, `<domain prefix>:<n>` in generation order
    /// ([`Domain::id_prefix`]).
    pub id: String,
    /// The seed topic it was written for ([`Domain::topics`]).
    pub topic: String,
    /// The kind of request ([`Domain::kinds`] label).
    pub kind: String,
    /// The request as written: a user message, a math problem, a one-line
    /// code task, or (kind `signature`) a Python function header with its
    /// docstring. The dataset loader templates it as the matching
    /// evaluation set is.
    pub text: String,
}

/// A generated request made usable, or `None` if it is not one: the first
/// non-empty line, without a leading label (`Question:`, `User:` …), list
/// marker or surrounding quotes, whitespace collapsed; 20–400 characters,
/// at least four words.
pub fn clean(raw: &str) -> Option<String> {
    let para = raw.lines().map(str::trim).find(|p| !p.is_empty())?;
    let mut t: String = para.split_whitespace().collect::<Vec<_>>().join(" ");
    loop {
        let before = t.len();
        for label in ["user message:", "message:", "user:", "question:", "request:", "prompt:", "query:"] {
            if t.get(..label.len()).is_some_and(|head| head.eq_ignore_ascii_case(label)) {
                t = t[label.len()..].trim_start().to_string();
            }
        }
        t = t.trim_start_matches(['-', '*', '#', '>']).trim_start().to_string();
        for (open, close) in [('"', '"'), ('“', '”'), ('\'', '\'')] {
            if t.starts_with(open) && t.ends_with(close) && t.chars().count() >= 2 {
                let mut cs = t.chars();
                cs.next();
                cs.next_back();
                t = cs.as_str().trim().to_string();
            }
        }
        if t.len() == before {
            break;
        }
    }
    let words = t.split_whitespace().count();
    let chars = t.chars().count();
    ((20..=400).contains(&chars) && words >= 4 && t.chars().any(char::is_alphabetic)).then_some(t)
}

/// A generated Python function header made usable, or `None` if it is
/// not one: `raw` is the text after `def ` up to (at least) the docstring's
/// end. Kept: `def name(args):` (optionally with a return annotation), then
/// a docstring of at least four words in triple quotes, nothing after it;
/// 30–600 characters. Trailing spaces are trimmed from every line.
pub fn clean_signature(raw: &str) -> Option<String> {
    let text: String = format!("def {}", raw.trim_start()).lines().map(str::trim_end).collect::<Vec<_>>().join("\n");
    let header_end = text.find(":\n")?;
    let header = &text[..header_end];
    let name = header.strip_prefix("def ")?.split('(').next()?;
    let valid_name = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !valid_name || !header.contains(')') || header.contains('\n') {
        return None;
    }
    let body = &text[header_end + 2..];
    let open = body.find("\"\"\"")?;
    if !body[..open].trim().is_empty() {
        return None; // code before the docstring
    }
    let close = body[open + 3..].find("\"\"\"")? + open + 3;
    let doc = &body[open + 3..close];
    if doc.split_whitespace().count() < 4 || !doc.chars().any(char::is_alphabetic) {
        return None;
    }
    let kept = format!("{header}:\n{}", &body[..close + 3]);
    (30..=600).contains(&kept.chars().count()).then_some(kept)
}

/// Lower-case words of letters and digits.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

fn ngrams(ws: &[String], n: usize) -> HashSet<String> {
    ws.windows(n).map(|w| w.join(" ")).collect()
}

/// Accepts requests that are new: not a near-duplicate of an accepted one
/// (word 3-gram Jaccard similarity ≥ `max_similarity`) and sharing no run
/// of [`EVAL_RUN`] words with any evaluation prompt.
pub struct Novelty {
    accepted: Vec<HashSet<String>>,
    eval_runs: HashSet<String>,
    max_similarity: f64,
}

/// Words in a row that a training prompt may not share with an evaluation
/// prompt.
pub const EVAL_RUN: usize = 8;

impl Novelty {
    /// A filter against the evaluation prompts `eval` (their full texts).
    pub fn new<'a>(eval: impl IntoIterator<Item = &'a str>, max_similarity: f64) -> Self {
        let mut eval_runs = HashSet::new();
        for text in eval {
            eval_runs.extend(ngrams(&words(text), EVAL_RUN));
        }
        Self { accepted: Vec::new(), eval_runs, max_similarity }
    }

    /// Whether `text` shares a run of [`EVAL_RUN`] words with an evaluation prompt.
    pub fn overlaps_evaluation(&self, text: &str) -> bool {
        ngrams(&words(text), EVAL_RUN).iter().any(|g| self.eval_runs.contains(g))
    }

    /// Records and returns `true` when `text` is new.
    pub fn admit(&mut self, text: &str) -> bool {
        if self.overlaps_evaluation(text) {
            return false;
        }
        let ws = words(text);
        let grams = if ws.len() >= 3 { ngrams(&ws, 3) } else { ngrams(&ws, 1) };
        let similar = self.accepted.iter().any(|seen| {
            let common = seen.intersection(&grams).count() as f64;
            let union = (seen.len() + grams.len()) as f64 - common;
            union > 0.0 && common / union >= self.max_similarity
        });
        if similar {
            return false;
        }
        self.accepted.push(grams);
        true
    }
}

/// Settings of [`self_instruct`].
#[derive(Debug, Clone)]
pub struct SelfInstructConfig {
    /// Prompts to keep.
    pub count: usize,
    /// Candidates to sample at most (each (topic, kind) pair in turn).
    pub max_attempts: usize,
    /// Sampling temperature.
    pub temperature: f64,
    /// Seed: candidate `i` is sampled with seed `seed + i`.
    pub seed: u64,
    /// Longest request (tokens).
    pub max_new_tokens: usize,
    /// Sequences sampled together ([`bastion_models::Model::decode_batch`]).
    pub batch: usize,
    /// Near-duplicate threshold (word 3-gram Jaccard).
    pub max_similarity: f64,
    /// What the prompts are ([`Domain`]).
    pub domain: Domain,
}

impl Default for SelfInstructConfig {
    fn default() -> Self {
        Self {
            count: 3000,
            max_attempts: 12_000,
            temperature: 0.7,
            seed: 0,
            max_new_tokens: 80,
            batch: 32,
            max_similarity: 0.5,
            domain: Domain::Chat,
        }
    }
}

/// Samples prompts of `cfg.domain` from the target: candidate `i` asks for
/// (`topics[i mod T]`, `kinds[(i / T) mod K]`) of that domain and is
/// sampled with its own seed, so the result depends only on the model and
/// `cfg`. A one-line request ends at its line's end; a code `signature`
/// ends with its docstring (at most twice `cfg.max_new_tokens` tokens).
/// Candidates go through [`clean`] (or [`clean_signature`]) and `novelty`
/// in order; the first `cfg.count` kept are returned, numbered in that
/// order. `on_candidate(kept, tried)` reports progress.
///
/// # Errors
/// [`TrainError::Usage`] for `batch == 0` or `count == 0`; model, chat
/// template and tokenizer errors.
pub fn self_instruct(
    pair: &LoadedPair,
    cfg: &SelfInstructConfig,
    novelty: &mut Novelty,
    mut on_candidate: impl FnMut(usize, usize),
) -> Result<Vec<ChatPrompt>> {
    if cfg.batch == 0 || cfg.count == 0 {
        return Err(TrainError::Usage("self-instruct needs --batch ≥ 1 and --count ≥ 1".into()));
    }
    let model = pair.target();
    let tokenizer = pair.tokenizer()?;
    let stop = pair.stop_tokens().to_vec();
    // Tokens whose text holds a line break.
    let newline: HashSet<u32> = (0..tokenizer.vocab_size() as u32)
        .filter(|&t| tokenizer.decode(&[t], false).is_ok_and(|s| s.contains('\n')))
        .collect();
    let vocab = model.config().vocab_size;
    let domain = cfg.domain;
    let (topics, kinds) = (domain.topics(), domain.kinds());
    let pair_of = |i: usize| (topics[i % topics.len()], kinds[(i / topics.len()) % kinds.len()]);
    let mut kept: Vec<ChatPrompt> = Vec::new();
    let mut next = 0;
    while kept.len() < cfg.count && next < cfg.max_attempts {
        // One batch of candidates, sampled to completion.
        let ids: Vec<usize> = (next..(next + cfg.batch).min(cfg.max_attempts)).collect();
        next += ids.len();
        let mut samplers: Vec<Sampler> =
            ids.iter().map(|&i| Sampler::new(cfg.temperature, cfg.seed.wrapping_add(i as u64))).collect();
        let mut outs: Vec<Vec<u32>> = vec![Vec::new(); ids.len()];
        let prompts: Vec<Vec<u32>> = ids
            .iter()
            .map(|&i| {
                let (topic, (_, opening)) = pair_of(i);
                tokenizer.encode(&domain.instruction(topic, opening), true)
            })
            .collect::<std::result::Result<_, _>>()?;
        let sessions = start_batch(model, &prompts, &mut samplers, &mut outs)?;
        // A one-line request ends at its line's end; a function header with
        // the end of its docstring (or a blank line before one).
        let finished = |b: usize, out: &[u32]| -> Result<bool> {
            let signature = domain.is_signature(pair_of(ids[b]).1 .1);
            let stopped = out.last().is_some_and(|t| stop.contains(t));
            if !signature {
                return Ok(stopped
                    || out.len() >= cfg.max_new_tokens
                    || out.last().is_some_and(|t| newline.contains(t)));
            }
            if stopped || out.len() >= 2 * cfg.max_new_tokens {
                return Ok(true);
            }
            if !out.last().is_some_and(|t| newline.contains(t)) && !out.len().is_multiple_of(4) {
                return Ok(false);
            }
            let text = tokenizer.decode(out, true)?;
            Ok(text.matches("\"\"\"").count() >= 2 || text.contains("\n\n"))
        };
        let mut live = Vec::new();
        let mut live_sessions = Vec::new();
        for (b, session) in sessions.into_iter().enumerate() {
            if !finished(b, &outs[b])? {
                live.push(b);
                live_sessions.push(session);
            }
        }
        while !live.is_empty() {
            let tokens: Vec<u32> = live.iter().map(|&b| *outs[b].last().expect("one token")).collect();
            let logits = model.decode_batch(&mut live_sessions, &tokens)?;
            for (r, &b) in live.iter().enumerate() {
                let tok = samplers[b].sample(&logits[r * vocab..(r + 1) * vocab]);
                outs[b].push(tok);
            }
            for r in (0..live.len()).rev() {
                if finished(live[r], &outs[live[r]])? {
                    live.remove(r);
                    live_sessions.remove(r);
                }
            }
        }
        for (b, &i) in ids.iter().enumerate() {
            let (topic, (label, opening)) = pair_of(i);
            let raw = tokenizer.decode(&outs[b], true)?;
            let text =
                if domain.is_signature(opening) { clean_signature(&raw) } else { clean(&format!("{opening}{raw}")) };
            if let Some(text) = text.filter(|t| kept.len() < cfg.count && novelty.admit(t)) {
                kept.push(ChatPrompt {
                    id: format!("{}:{}", domain.id_prefix(), kept.len()),
                    topic: topic.to_string(),
                    kind: label.to_string(),
                    text,
                });
            }
        }
        on_candidate(kept.len(), next);
    }
    Ok(kept)
}

/// Sessions of a batch of `prompts`, each with its first sampled token in
/// `outs`: the prompts' shared head (chat template, first sentence) is
/// prefilled once and forked.
fn start_batch<'m>(
    model: &'m bastion_models::Model,
    prompts: &[Vec<u32>],
    samplers: &mut [Sampler],
    outs: &mut [Vec<u32>],
) -> Result<Vec<bastion_models::Session<'m>>> {
    let heads: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let shared = crate::distill::shared_head(&heads);
    let mut base = model.session();
    if shared > 0 {
        base.prefill(&prompts[0][..shared], &[])?;
    }
    let mut sessions = Vec::with_capacity(prompts.len());
    for (b, prompt) in prompts.iter().enumerate() {
        let mut session = base.fork()?;
        outs[b].push(samplers[b].sample_output_row(&session.prefill(&prompt[shared..], &[])?, 0)?);
        sessions.push(session);
    }
    Ok(sessions)
}

/// Writes `prompts` as JSON lines to `path` (through a temporary file
/// renamed into place, so a crash never leaves a partial file).
///
/// # Errors
/// [`TrainError::Io`] naming the path.
pub fn write_chat_prompts(path: &Path, prompts: &[ChatPrompt]) -> Result<()> {
    let io = |source| TrainError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("jsonl.partial");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    for p in prompts {
        let line = serde_json::to_string(p).expect("a chat prompt serializes");
        writeln!(f, "{line}").map_err(io)?;
    }
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_strips_labels_quotes_and_keeps_the_first_line() {
        assert_eq!(
            clean("User: \"How do I boil an egg so the yolk stays soft?\"\nSure! Here is…").as_deref(),
            Some("How do I boil an egg so the yolk stays soft?")
        );
        assert_eq!(
            clean("  - Question:  What   is a black hole, simply put?").as_deref(),
            Some("What is a black hole, simply put?")
        );
        assert_eq!(clean("Hi!"), None, "too short");
        // Multi-byte characters where a label would end are not labels.
        assert_eq!(
            clean("If I’m late, what should I tell them?").as_deref(),
            Some("If I’m late, what should I tell them?")
        );
        assert_eq!(clean("Qué é“x” y z, por favor").as_deref(), Some("Qué é“x” y z, por favor"));
        assert_eq!(clean(&"word ".repeat(100)), None, "too long");
        assert_eq!(clean("\n\n  \n"), None);
        assert_eq!(
            clean("\n  Why does bread go stale so fast?\nBecause…").as_deref(),
            Some("Why does bread go stale so fast?")
        );
        assert_eq!(clean("1234 5678 9012 3456 7890"), None, "no letters");
    }

    #[test]
    fn novelty_drops_near_duplicates_and_evaluation_overlap() {
        let eval =
            ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences."];
        let mut n = Novelty::new(eval.iter().copied(), 0.5);
        assert!(n.admit("How do I make a sourdough starter from scratch at home?"));
        assert!(!n.admit("How do I make a sourdough starter from scratch at home??"), "same words");
        assert!(!n.admit("How do I make a sourdough starter from scratch at my home?"), "near duplicate");
        assert!(n.admit("What is the difference between baking soda and baking powder?"));
        assert!(!n.admit("Please compose an engaging travel blog post about a recent trip to Hawaii for me."));
        assert!(n.overlaps_evaluation("an ENGAGING travel blog post about a recent trip to Hawaii"));
        assert!(!n.overlaps_evaluation("a travel blog post about Hawaii"));
    }

    #[test]
    fn every_instruction_names_its_topic_and_kind() {
        for d in Domain::ALL {
            for t in d.topics() {
                for (_, k) in d.kinds() {
                    let s = d.instruction(t, k);
                    assert!(s.contains(t) && s.ends_with(k), "{d}: {s}");
                    if k == &"def " {
                        // The worked example is itself a header the cleaner keeps.
                        let example = s.split("\n\n").nth(1).unwrap();
                        assert!(clean_signature(&example["def ".len()..]).is_some(), "{example}");
                    }
                }
            }
            assert_eq!(d.topics().iter().collect::<HashSet<_>>().len(), d.topics().len(), "{d}: repeated topic");
            assert_eq!(d.name().parse::<Domain>(), Ok(d));
            assert!(d.file().contains(d.name()) && d.id_prefix().starts_with(d.name()));
        }
        // Labels are unique per opening (the code domain repeats its
        // signature kind on purpose, to draw it more often).
        for d in Domain::ALL {
            let pairs: HashSet<_> = d.kinds().iter().collect();
            let labels: HashSet<&str> = d.kinds().iter().map(|(l, _)| *l).collect();
            assert_eq!(labels.len(), pairs.len(), "{d}");
        }
        // The chat document is the one the committed chat prompts were written with.
        assert_eq!(
            instruction("poetry", "Why does"),
            "Messages that users sent to a helpful AI assistant about poetry, one per line:\n- Why does"
        );
        assert!("prose".parse::<Domain>().unwrap_err().contains("chat, math, code"));
    }

    #[test]
    fn clean_signature_keeps_a_header_and_its_docstring_only() {
        assert_eq!(
            clean_signature("count_vowels(s: str) -> int:  \n    \"\"\"Return how many vowels the string s holds.\"\"\"\n    return 0\n").as_deref(),
            Some("def count_vowels(s: str) -> int:\n    \"\"\"Return how many vowels the string s holds.\"\"\"")
        );
        let multi = "pairs(xs):\n    \"\"\"Given a list xs, return every pair\n    whose sum is zero.\n    >>> pairs([1, -1])\n    [(1, -1)]\n    \"\"\"\n";
        let kept = clean_signature(multi).unwrap();
        assert!(kept.starts_with("def pairs(xs):\n") && kept.ends_with("\"\"\""), "{kept}");
        assert_eq!(clean_signature("f(x):\n    \"\"\"Add one.\"\"\""), None, "docstring under four words");
        assert_eq!(
            clean_signature("f(x):\n    return x\n    \"\"\"Return x plus one always.\"\"\""),
            None,
            "code first"
        );
        assert_eq!(clean_signature("2f(x):\n    \"\"\"Return x plus one always.\"\"\""), None, "bad name");
        assert_eq!(clean_signature("f(x):\n    \"\"\"Return x plus one always and"), None, "unclosed");
        assert_eq!(clean_signature("f x:\n    \"\"\"Return x plus one always.\"\"\""), None, "no parentheses");
    }
}
