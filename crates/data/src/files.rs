//! A user's own evaluation set: a JSONL file with one record per prompt, as
//! Spec-Bench and lm-evaluation-harness users keep them, declared in an
//! experiment file (`[[datasets.files]]`). The prompt is a record field, a
//! field of successive user turns, or a minijinja template over the record;
//! two published layouts come with their templates: LiveCodeBench's code
//! generation files and LongBench's.

use std::path::PathBuf;

use serde_json::Value;

use crate::{DataError, DatasetName, Prompt, Result, Selection, UserName};

/// Where a record's user message(s) come from. Serialised as
/// `{"field": …}`, `{"turns": …}` or `{"template": …}` (a sweep's
/// `settings.json` records it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptSource {
    /// A string field, sent as written.
    Field(String),
    /// A field holding a non-empty array of strings: successive user turns
    /// (each continues the previous turn's answer, as MT-Bench's).
    Turns(String),
    /// A minijinja template over the record's fields (`{{ question }}`);
    /// printing a field the record lacks is an error naming it.
    Template(String),
}

/// A published file layout: its id field and its prompt template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileLayout {
    /// No preset: the experiment names the prompt field, turns field or
    /// template, and optionally the id field (default `id`).
    #[default]
    Generic,
    /// LiveCodeBench code generation (`livecodebench/code_generation_lite`
    /// `test*.jsonl`: `question_id`, `question_content`, `starter_code`, …),
    /// prompted as LiveCodeBench prompts generic chat models
    /// (`lcb_runner/prompts/code_generation.py`: the system sentence, then
    /// the question and the format with or without starter code). One
    /// deviation: LiveCodeBench sends the system sentence as a system turn;
    /// here it opens the user message, since a prompt is user turns wrapped
    /// in the target's chat template (with whatever system turn that adds).
    LiveCodeBench,
    /// LongBench (`THUDM/LongBench` `data/*.jsonl`: `_id`, `context`,
    /// `input`, `answers`, …): the context, then the question when `input`
    /// is not empty, in a generic prompt of Bastion's own. LongBench's
    /// prompts differ per task (`config/dataset2prompt.json`): give one as
    /// the template to use it. Contexts are not truncated (LongBench cuts
    /// the middle of a context longer than the model's window): a prompt
    /// longer than the target's context fails when it runs.
    LongBench,
}

impl std::str::FromStr for FileLayout {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "generic" => Ok(Self::Generic),
            "livecodebench" => Ok(Self::LiveCodeBench),
            "longbench" => Ok(Self::LongBench),
            _ => Err(DataError::Selection(format!(
                "unknown layout `{s}`; expected one of: generic, livecodebench, longbench"
            ))),
        }
    }
}

const LIVECODEBENCH_TEMPLATE: &str = "You are an expert Python programmer. You will be given a question \
(problem specification) and will generate a correct Python program that matches the specification and \
passes all tests.\n\n### Question:\n{{ question_content }}\n\n\
{% if starter_code %}### Format: You will use the following starter code to write the solution to the \
problem and enclose your code within delimiters.\n```python\n{{ starter_code }}\n```\n\n\
{% else %}### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not \
directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the \
python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n\
```python\n# YOUR CODE HERE\n```\n\n{% endif %}### Answer: (use the provided format with backticks)\n\n";

const LONGBENCH_TEMPLATE: &str = "Read the text below, then answer.\n\n{{ context }}\n\n\
{% if input %}Question: {{ input }}\n{% endif %}Answer:";

impl FileLayout {
    /// The layout's id field and prompt, if it has them.
    fn preset(self) -> (Option<&'static str>, Option<PromptSource>) {
        match self {
            Self::Generic => (None, None),
            Self::LiveCodeBench => {
                (Some("question_id"), Some(PromptSource::Template(LIVECODEBENCH_TEMPLATE.to_string())))
            }
            Self::LongBench => (Some("_id"), Some(PromptSource::Template(LONGBENCH_TEMPLATE.to_string()))),
        }
    }
}

/// A user's JSONL evaluation set: its name in records and tables, its path
/// and how a record becomes a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetFile {
    /// The set's name (a [`DatasetName::User`]).
    pub name: DatasetName,
    /// The JSONL file.
    pub path: PathBuf,
    /// The user message(s) of a record.
    pub prompt: PromptSource,
    /// The field holding a record's id (a string or a number): the
    /// experiment's or the layout's, required on every record; or, when
    /// neither names one, `id` where a record has it and else the 0-based
    /// line index. Ids are unique within the file (they key the records).
    pub id: String,
    /// Whether every record must have the id field (it was named).
    pub id_required: bool,
}

impl DatasetFile {
    /// A file's settings: `prompt` overrides the layout's (a
    /// [`FileLayout::Generic`] file needs one), `id` its id field.
    ///
    /// # Errors
    /// [`DataError::Selection`] for a bad name ([`UserName::new`]), a
    /// generic layout without a prompt, or a template that does not parse
    /// (minijinja's message).
    pub fn new(
        name: &str,
        path: impl Into<PathBuf>,
        layout: FileLayout,
        prompt: Option<PromptSource>,
        id: Option<String>,
    ) -> Result<Self> {
        let name = DatasetName::User(UserName::new(name)?);
        let (preset_id, preset_prompt) = layout.preset();
        let prompt = prompt.or(preset_prompt).ok_or_else(|| {
            DataError::Selection(format!(
                "dataset `{name}`: expected `prompt` (a field), `turns` (a field of user turns) or `template`, \
                 or a `layout` (livecodebench, longbench)"
            ))
        })?;
        if let PromptSource::Template(t) = &prompt {
            environment()
                .template_from_str(t)
                .map_err(|e| DataError::Selection(format!("dataset `{name}`: the template does not parse: {e}")))?;
        }
        let id = id.or(preset_id.map(str::to_string));
        let id_required = id.is_some();
        Ok(Self { name, path: path.into(), prompt, id: id.unwrap_or_else(|| "id".to_string()), id_required })
    }

    /// Reads the file: the first `selection.max_samples` records in file
    /// order (a user's file has no papers' subset: `paper_subset` keeps every
    /// record).
    ///
    /// # Errors
    /// [`DataError::Io`] naming the file; as [`DatasetFile::parse`].
    pub fn load(&self, selection: &Selection) -> Result<Vec<Prompt>> {
        if selection.per_group.is_some() {
            return Err(DataError::Selection(format!(
                "dataset `{}`: a per-group subset needs a set with task groups (spec-bench)",
                self.name
            )));
        }
        let bytes = std::fs::read(&self.path).map_err(|source| DataError::Io { path: self.path.clone(), source })?;
        self.parse(&bytes, selection.max_samples)
    }

    /// The prompts of the JSONL `bytes` (blank lines skipped), at most `max`.
    ///
    /// # Errors
    /// [`DataError::Record`] naming the file, the 1-based line and the field
    /// (`(record)` for a line that is not a JSON object, `(file)` for text
    /// that is not UTF-8 or a file without records).
    pub fn parse(&self, bytes: &[u8], max: Option<usize>) -> Result<Vec<Prompt>> {
        let err = |line: usize, field: &str, expected: String| DataError::Record {
            path: self.path.clone(),
            line,
            field: field.to_string(),
            expected,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| err(0, "(file)", format!("UTF-8 text ({e})")))?;
        // A byte-order mark (some editors write one) is no part of the first record.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let env = environment();
        let template = match &self.prompt {
            PromptSource::Template(t) => Some(env.template_from_str(t).map_err(|e| {
                DataError::Selection(format!("dataset `{}`: the template does not parse: {e}", self.name))
            })?),
            _ => None,
        };
        let mut out = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for (i, line) in text.lines().enumerate() {
            if out.len() >= max.unwrap_or(usize::MAX) {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            let record: Value = match serde_json::from_str::<Value>(line) {
                Ok(v) if v.is_object() => v,
                Ok(_) => return Err(err(i + 1, "(record)", "a JSON object".into())),
                Err(e) => return Err(err(i + 1, "(record)", format!("a JSON object, one per line ({e})"))),
            };
            let turns = match (&self.prompt, &template) {
                (PromptSource::Field(f), _) => vec![record
                    .get(f)
                    .and_then(Value::as_str)
                    .ok_or_else(|| err(i + 1, f, "a string (the prompt)".into()))?
                    .to_string()],
                (PromptSource::Turns(f), _) => record
                    .get(f)
                    .and_then(Value::as_array)
                    .filter(|t| !t.is_empty())
                    .and_then(|t| t.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| err(i + 1, f, "a non-empty array of strings (the user turns)".into()))?,
                (PromptSource::Template(_), Some(t)) => {
                    let render = |r: &Value| t.render(minijinja::Value::from(minijinja::value::Serde(r)));
                    let rendered = render(&record).map_err(|e| {
                        // The fields the template uses that this record lacks; name the first
                        // one that is printed (not only tested): with every other missing
                        // field filled in, the record still fails without it.
                        let mut missing: Vec<String> =
                            t.undeclared_variables(false).into_iter().filter(|v| record.get(v).is_none()).collect();
                        missing.sort();
                        let fill = |skip: &str| {
                            let mut r = record.clone();
                            for m in missing.iter().filter(|m| m.as_str() != skip) {
                                r[m.as_str()] = Value::String(String::new());
                            }
                            r
                        };
                        match missing.iter().find(|m| render(&fill(m)).is_err()) {
                            Some(f) => err(i + 1, f, "a value (the template prints it)".into()),
                            None => err(i + 1, "(template)", format!("a record the template renders ({e})")),
                        }
                    })?;
                    vec![rendered]
                }
                (PromptSource::Template(_), None) => unreachable!("the template was compiled above"),
            };
            if turns.iter().all(|t| t.trim().is_empty()) {
                return Err(err(i + 1, "(prompt)", "a non-empty prompt".into()));
            }
            let id = match record.get(&self.id).filter(|v| !v.is_null()) {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Number(_)) => v.to_string(),
                Some(_) => return Err(err(i + 1, &self.id, "a string or a number (the record's id)".into())),
                None if self.id_required => {
                    return Err(err(i + 1, &self.id, "an id (a string or a number) on every record".into()))
                }
                None => i.to_string(),
            };
            if let Some(first) = seen.insert(id.clone(), i + 1) {
                return Err(err(i + 1, &self.id, format!("a unique id (`{id}` is also line {first}'s)")));
            }
            // A string `category` travels with the prompt (tables can group by it).
            let category = record.get("category").and_then(Value::as_str).map(str::to_string);
            out.push(Prompt { dataset: self.name.clone(), index: i, id, turns, category });
        }
        if out.is_empty() && max != Some(0) {
            return Err(err(0, "(file)", "at least one record".into()));
        }
        Ok(out)
    }

    /// The sha256 of the file's bytes (hex), recorded with a sweep's
    /// settings so that a changed file does not resume into its records.
    ///
    /// # Errors
    /// [`DataError::Io`] naming the file.
    pub fn sha256(&self) -> Result<String> {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(&self.path).map_err(|source| DataError::Io { path: self.path.clone(), source })?;
        Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// The template environment: printing an undefined field is an error, a
/// test of one (`{% if starter_code %}`) is false; the template's trailing
/// newline is kept (LiveCodeBench's prompt ends with a blank line).
fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::SemiStrict);
    let syntax = minijinja::syntax::SyntaxConfig::builder().keep_trailing_newline(true).build();
    env.set_syntax(syntax.expect("the default delimiters are valid"));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(layout: FileLayout, prompt: Option<PromptSource>) -> DatasetFile {
        DatasetFile::new("mine", "mine.jsonl", layout, prompt, None).unwrap()
    }

    #[test]
    fn a_prompt_field_an_id_and_blank_lines() {
        let f = file(FileLayout::Generic, Some(PromptSource::Field("q".into())));
        let p = f.parse(b"{\"q\": \"one\", \"id\": 7}\n\n{\"q\": \"two\"}\n", None).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].id.as_str(), p[0].turns.as_slice()), ("7", &["one".to_string()][..]));
        assert_eq!((p[1].index, p[1].id.as_str()), (2, "2"));
        assert_eq!(p[0].dataset.as_str(), "mine");
        assert_eq!(f.parse(b"{\"q\": \"a\"}\n{\"q\": \"b\"}\n", Some(1)).unwrap().len(), 1);
    }

    #[test]
    fn turns_and_templates() {
        let f = file(FileLayout::Generic, Some(PromptSource::Turns("turns".into())));
        let p = f.parse(br#"{"turns": ["a", "b"]}"#, None).unwrap();
        assert_eq!(p[0].turns, ["a", "b"]);
        let f = file(
            FileLayout::Generic,
            Some(PromptSource::Template("Q: {{ q }}{% if hint %} ({{ hint }}){% endif %}".into())),
        );
        let p = f.parse(b"{\"q\": \"x\", \"hint\": \"h\"}\n{\"q\": \"y\"}\n", None).unwrap();
        assert_eq!((p[0].turns[0].as_str(), p[1].turns[0].as_str()), ("Q: x (h)", "Q: y"));
    }

    #[test]
    fn bad_records_name_the_line_and_field() {
        let f = file(FileLayout::Generic, Some(PromptSource::Field("q".into())));
        let e = f.parse(b"{\"q\": \"ok\"}\n{\"question\": \"no\"}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:2: field `q`: expected a string (the prompt)");
        let e = f.parse(b"[1, 2]\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:1: field `(record)`: expected a JSON object");
        let e = f.parse(b"{\"q\": \"ok\"}\n{\"q\": \"no\"\n", None).unwrap_err().to_string();
        assert!(e.starts_with("mine.jsonl:2: field `(record)`: expected a JSON object, one per line (EOF"), "{e}");
        // A byte-order mark before the first record is skipped.
        let p = f.parse("\u{feff}{\"q\": \"x\"}\n".as_bytes(), None).unwrap();
        assert_eq!(p[0].turns, ["x"]);
        let e = f.parse(b"", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:0: field `(file)`: expected at least one record");
        let t = file(FileLayout::Generic, Some(PromptSource::Template("{{ context }} {{ input }}".into())));
        let e = t.parse(b"{\"context\": \"c\"}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:1: field `input`: expected a value (the template prints it)");
        // A field only tested (`hint`) is not the one named.
        let t = file(FileLayout::Generic, Some(PromptSource::Template("Q: {{ q }}{% if hint %}!{% endif %}".into())));
        let e = t.parse(b"{\"x\": 1}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:1: field `q`: expected a value (the template prints it)");
        // Ids key the records: unique, and present when named.
        let ids = DatasetFile::new(
            "mine",
            "mine.jsonl",
            FileLayout::Generic,
            Some(PromptSource::Field("q".into())),
            Some("qid".into()),
        )
        .unwrap();
        let e = ids.parse(b"{\"q\": \"a\", \"qid\": 1}\n{\"q\": \"b\", \"qid\": 1}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:2: field `qid`: expected a unique id (`1` is also line 1's)");
        let e = ids.parse(b"{\"q\": \"a\"}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:1: field `qid`: expected an id (a string or a number) on every record");
        let e = ids.parse(b"{\"q\": \"a\", \"qid\": [1]}\n", None).unwrap_err().to_string();
        assert_eq!(e, "mine.jsonl:1: field `qid`: expected a string or a number (the record's id)");
        // Without a named id field, a line index may not collide with a record's own id.
        let e = f.parse(b"{\"q\": \"a\", \"id\": 1}\n{\"q\": \"b\"}\n", None).unwrap_err().to_string();
        assert!(e.contains("expected a unique id (`1` is also line 1's)"), "{e}");
        let turns = file(FileLayout::Generic, Some(PromptSource::Turns("turns".into())));
        let e = turns.parse(br#"{"turns": []}"#, None).unwrap_err().to_string();
        assert!(e.contains("field `turns`: expected a non-empty array of strings"), "{e}");
    }

    #[test]
    fn settings_are_checked() {
        let e = DatasetFile::new("mine", "m.jsonl", FileLayout::Generic, None, None).unwrap_err().to_string();
        assert!(e.contains("expected `prompt`"), "{e}");
        let e = DatasetFile::new("gsm8k", "m.jsonl", FileLayout::LongBench, None, None).unwrap_err().to_string();
        assert!(e.contains("is a built-in set's"), "{e}");
        let e = DatasetFile::new("my set", "m.jsonl", FileLayout::LongBench, None, None).unwrap_err().to_string();
        assert!(e.contains("expected letters, digits"), "{e}");
        let bad = Some(PromptSource::Template("{{ q ".into()));
        let e = DatasetFile::new("mine", "m.jsonl", FileLayout::Generic, bad, None).unwrap_err().to_string();
        assert!(e.contains("the template does not parse"), "{e}");
        assert_eq!("livecodebench".parse::<FileLayout>().unwrap(), FileLayout::LiveCodeBench);
        assert!("lcb".parse::<FileLayout>().is_err());
    }

    #[test]
    fn user_names_round_trip_as_stored_names() {
        let f = file(FileLayout::LongBench, None);
        let stored: DatasetName = serde_json::from_str("\"mine\"").unwrap();
        assert_eq!(stored, f.name);
        assert_eq!(serde_json::to_string(&f.name).unwrap(), "\"mine\"");
        // Experiment files and the CLI take built-in names only.
        assert!("mine".parse::<DatasetName>().is_err());
        assert!(DatasetName::ALL.iter().all(|d| *d < f.name), "built-in sets sort first");
    }

    #[test]
    fn livecodebench_layout_with_and_without_starter_code() {
        let f = file(FileLayout::LiveCodeBench, None);
        let rows = concat!(
            r#"{"question_title": "t", "question_content": "Add two numbers.", "platform": "leetcode", "question_id": "q1", "#,
            r#""contest_id": "c", "contest_date": "2025-01-01T00:00:00", "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ", "difficulty": "easy", "public_test_cases": "[]", "private_test_cases": "", "metadata": "{}"}"#,
            "\n",
            r#"{"question_title": "u", "question_content": "Read N and print N+1.", "platform": "atcoder", "question_id": "abc1_a", "#,
            r#""contest_id": "abc1", "contest_date": "2025-01-02T00:00:00", "starter_code": "", "difficulty": "easy", "public_test_cases": "[]", "private_test_cases": "", "metadata": "{}"}"#,
        );
        let p = f.parse(rows.as_bytes(), None).unwrap();
        assert_eq!((p[0].id.as_str(), p[1].id.as_str()), ("q1", "abc1_a"));
        let with = &p[0].turns[0];
        assert!(with.starts_with("You are an expert Python programmer."), "{with}");
        assert!(with.contains("### Question:\nAdd two numbers.\n\n### Format: You will use the following starter code"));
        assert!(
            with.contains("```python\nclass Solution:\n    def add(self, a: int, b: int) -> int:\n        \n```\n\n")
        );
        assert!(with.ends_with("### Answer: (use the provided format with backticks)\n\n"), "{with:?}");
        let without = &p[1].turns[0];
        assert!(without.contains("### Format: Read the inputs from stdin"), "{without}");
        assert!(without.contains("```python\n# YOUR CODE HERE\n```\n\n### Answer:"), "{without}");
    }

    #[test]
    fn longbench_layout_with_and_without_a_question() {
        let f = file(FileLayout::LongBench, None);
        let rows = concat!(
            r#"{"input": "Who wrote it?", "context": "A long text by Ann.", "answers": ["Ann"], "length": 5, "dataset": "qasper", "language": "en", "all_classes": null, "_id": "a1"}"#,
            "\n",
            r#"{"input": "", "context": "A report to summarise.", "answers": ["s"], "length": 4, "dataset": "gov_report", "language": "en", "all_classes": null, "_id": "b2"}"#,
        );
        let p = f.parse(rows.as_bytes(), None).unwrap();
        assert_eq!(p[0].id, "a1");
        assert_eq!(
            p[0].turns[0],
            "Read the text below, then answer.\n\nA long text by Ann.\n\nQuestion: Who wrote it?\nAnswer:"
        );
        assert_eq!(p[1].turns[0], "Read the text below, then answer.\n\nA report to summarise.\n\nAnswer:");
    }
}
