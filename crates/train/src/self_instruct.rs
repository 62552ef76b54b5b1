//! Chat-style training prompts written by the target itself (self-instruct):
//! the evaluation mix has chat questions (MT-Bench), and no offline chat
//! training set ships with the project, so the target is asked, for every
//! pair of a seed topic and a kind of request, to write one request a user
//! might send to an assistant. The requests are sampled (T > 0, seeded),
//! cleaned, de-duplicated and kept only when they share no long word run
//! with any evaluation prompt.
//!
//! Method: Wang et al., "Self-Instruct: Aligning Language Models with
//! Self-Generated Instructions" (ACL 2023), §2: a model writes new
//! instructions from a seed pool and near-duplicates are filtered. Here the
//! seed pool is a list of topics and request kinds written for this project
//! ([`TOPICS`], [`KINDS`]) rather than seed tasks, and the filter is word
//! 3-gram Jaccard similarity instead of ROUGE-L.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use bastion_decode::{LoadedPair, Sampler};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Seed topics, broad on purpose: the requests should cover what users ask
/// chat assistants about.
pub const TOPICS: &[&str] = &[
    "cooking and recipes",
    "personal finance and budgeting",
    "travel planning",
    "physics",
    "chemistry",
    "biology",
    "world history",
    "geography",
    "astronomy",
    "Python programming",
    "JavaScript and web development",
    "databases and SQL",
    "writing a professional email",
    "job interviews and careers",
    "fitness and exercise",
    "nutrition and healthy eating",
    "sleep and daily routines",
    "learning a foreign language",
    "music and musical instruments",
    "movies and television",
    "books and literature",
    "poetry",
    "philosophy",
    "economics",
    "starting a small business",
    "marketing and social media",
    "gardening",
    "pets and animal care",
    "home repair and DIY projects",
    "parenting",
    "friendship and relationships",
    "studying and exam preparation",
    "climate and the environment",
    "renewable energy",
    "computers and hardware",
    "smartphones and apps",
    "machine learning",
    "statistics and probability",
    "geometry",
    "algebra",
    "board games and puzzles",
    "sports",
    "art and drawing",
    "photography",
    "public speaking",
    "time management and productivity",
    "ethics and everyday dilemmas",
    "law and everyday legal questions",
    "mental well-being and stress",
    "cars and transportation",
];

/// Kinds of request, as `(label, opening words)`: the target continues
/// the opening words, so each kind starts the way such requests do.
pub const KINDS: &[(&str, &str)] = &[
    ("explain", "Can you explain"),
    ("how-to", "How do I"),
    ("compare", "What is the difference between"),
    ("advice", "I need some advice."),
    ("brainstorm", "Give me a list of"),
    ("write", "Write a short"),
    ("rewrite", "Rewrite this sentence"),
    ("fact", "What is"),
    ("plan", "Can you make a plan"),
    ("opinion", "What are the pros and cons of"),
    ("summarize", "Summarize"),
    ("problem", "If I"),
    ("why", "Why does"),
    ("recommend", "Can you recommend"),
];

/// One chat prompt of `datasets/train/chat-self-instruct.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatPrompt {
    /// Stable id, `chat-self:<n>` in generation order.
    pub id: String,
    /// The seed topic it was written for ([`TOPICS`]).
    pub topic: String,
    /// The kind of request ([`KINDS`] label).
    pub kind: String,
    /// The request, as a user would send it.
    pub text: String,
}

/// The text the target continues for one (topic, opening words) pair: a
/// plain document (no chat template) listing user messages on the topic,
/// ending with the opening words of the next one. The first line of the
/// continuation completes the request.
pub fn instruction(topic: &str, opening: &str) -> String {
    format!("Messages that users sent to a helpful AI assistant about {topic}, one per line:\n- {opening}")
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
        }
    }
}

/// Samples chat prompts from the target: candidate `i` asks for
/// (`TOPICS[i mod T]`, `KINDS[(i / T) mod K]`) and is sampled with its own
/// seed, so the result depends only on the model and `cfg`. Candidates go
/// through [`clean`] and `novelty` in order; the first `cfg.count` kept
/// are returned, numbered in that order. `on_candidate(kept, tried)`
/// reports progress.
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
    let pair_of = |i: usize| (TOPICS[i % TOPICS.len()], KINDS[(i / TOPICS.len()) % KINDS.len()]);
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
                tokenizer.encode(&instruction(topic, opening), true)
            })
            .collect::<std::result::Result<_, _>>()?;
        // The instruction's shared head (chat template, first sentence) is
        // prefilled once per batch and forked.
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        let shared = prompts
            .iter()
            .map(|p| p.iter().zip(&prompts[0]).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap_or(0)
            .min(shortest.saturating_sub(1));
        let mut base = model.session();
        if shared > 0 {
            base.prefill(&prompts[0][..shared], &[])?;
        }
        let mut sessions = Vec::with_capacity(ids.len());
        for (b, prompt) in prompts.iter().enumerate() {
            let mut session = base.fork()?;
            outs[b].push(samplers[b].sample(session.prefill(&prompt[shared..], &[])?.row(0)));
            sessions.push(session);
        }
        // A request ends at its line's end.
        let finished = |out: &[u32]| {
            out.len() >= cfg.max_new_tokens || out.last().is_some_and(|t| stop.contains(t) || newline.contains(t))
        };
        let (mut live, mut live_sessions): (Vec<usize>, Vec<_>) =
            sessions.into_iter().enumerate().filter(|(b, _)| !finished(&outs[*b])).unzip();
        while !live.is_empty() {
            let tokens: Vec<u32> = live.iter().map(|&b| *outs[b].last().expect("one token")).collect();
            let logits = model.decode_batch(&mut live_sessions, &tokens)?;
            for (r, &b) in live.iter().enumerate() {
                let tok = samplers[b].sample(&logits[r * vocab..(r + 1) * vocab]);
                outs[b].push(tok);
            }
            for r in (0..live.len()).rev() {
                if finished(&outs[live[r]]) {
                    live.remove(r);
                    live_sessions.remove(r);
                }
            }
        }
        for (b, &i) in ids.iter().enumerate() {
            let (topic, (label, opening)) = pair_of(i);
            let text = format!("{opening}{}", tokenizer.decode(&outs[b], true)?);
            if let Some(text) = clean(&text).filter(|t| kept.len() < cfg.count && novelty.admit(t)) {
                kept.push(ChatPrompt {
                    id: format!("chat-self:{}", kept.len()),
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
        for t in TOPICS {
            for (_, k) in KINDS {
                let s = instruction(t, k);
                assert!(s.contains(t) && s.contains(k));
            }
        }
        let labels: HashSet<&str> = KINDS.iter().map(|(l, _)| *l).collect();
        assert_eq!(labels.len(), KINDS.len());
        assert_eq!(TOPICS.iter().collect::<HashSet<_>>().len(), TOPICS.len());
    }
}
