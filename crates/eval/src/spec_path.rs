//! Which field of an experiment file a deserialisation error is about, read
//! from the document as the TOML parser reads it: dotted keys
//! (`sweep.top_k = …`), inline tables, sub-tables of an array of tables and a
//! `[` at the start of a line inside a multi-line string are all placed where
//! TOML puts them, not where a line-by-line reading would.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Where byte range `at` of `text` lies in the document.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Place {
    /// The path of the deepest key or value whose span holds `at`
    /// (`variants[0].sweep.top_k`, `models[1]`, `datasets.names[0]`); `None`
    /// where no parsed key or value holds it (the text does not parse there).
    pub node: Option<String>,
    /// The path of the deepest key whose span holds `at` (a header's keys
    /// included: `dataset` in `[[dataset.files]]`, whose node is
    /// `dataset.files[0]`).
    pub key: Option<String>,
    /// The path of the table whose header is the last one at or before `at`
    /// (`datasets`, `variants[1]`, `models[0].extra`); empty at the top level.
    pub table: String,
}

/// The [`Place`] of `at` in `text`. A document that does not parse is read
/// as far as the parser recovers (`toml::de::DeTable::parse_recoverable`), so
/// the tables above a syntax error are still known.
pub(super) fn place(text: &str, at: &Range<usize>) -> Place {
    let (doc, _errors) = DeTable::parse_recoverable(text);
    let mut walk = Walk { text, at: at.clone(), node: None, key: None, table: None };
    for (key, value) in doc.get_ref() {
        walk.entry("", 0, key, value);
    }
    Place {
        node: walk.node.map(|(_, p)| p),
        key: walk.key.map(|(_, p)| p),
        table: walk.table.map(|(_, _, p)| p).unwrap_or_default(),
    }
}

/// A search of the whole document (a header table's keys lie outside the
/// header's span, so every table is entered whatever its own span).
struct Walk<'t> {
    text: &'t str,
    at: Range<usize>,
    /// (depth, path) of the deepest node holding `at` so far.
    node: Option<(usize, String)>,
    /// (depth, path) of the deepest key holding `at` so far.
    key: Option<(usize, String)>,
    /// (header start, depth, path) of the last header at or before `at`.
    table: Option<(usize, usize, String)>,
}

impl Walk<'_> {
    /// One key of a table at `path` (empty: the top level) and its value.
    fn entry(
        &mut self,
        path: &str,
        depth: usize,
        key: &Spanned<std::borrow::Cow<'_, str>>,
        value: &Spanned<DeValue<'_>>,
    ) {
        let path = if path.is_empty() { key.get_ref().to_string() } else { format!("{path}.{}", key.get_ref()) };
        if holds(&key.span(), &self.at) {
            deepest(&mut self.key, depth + 1, &path);
            deepest(&mut self.node, depth + 1, &path);
        }
        self.value(&path, depth + 1, value);
    }

    /// A value at `path`, `depth` segments deep, and everything inside it.
    fn value(&mut self, path: &str, depth: usize, value: &Spanned<DeValue<'_>>) {
        let span = value.span();
        if holds(&span, &self.at) {
            deepest(&mut self.node, depth, path);
        }
        match value.get_ref() {
            DeValue::Table(table) => {
                // A header table's span is its header (`[x]`, `[[x]]`); an
                // inline or dotted-key table's starts with `{` or its key.
                let header = self.text.get(span.start..).is_some_and(|t| t.starts_with('['));
                let later = self.table.as_ref().is_none_or(|(s, d, _)| (span.start, depth) > (*s, *d));
                if header && span.start <= self.at.start && later {
                    self.table = Some((span.start, depth, path.to_string()));
                }
                for (key, value) in table {
                    self.entry(path, depth, key, value);
                }
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.value(&format!("{path}[{i}]"), depth + 1, item);
                }
            }
            _ => {}
        }
    }
}

/// Keeps `path` in `best` when it is deeper than what `best` holds.
fn deepest(best: &mut Option<(usize, String)>, depth: usize, path: &str) {
    if best.as_ref().is_none_or(|(d, _)| depth > *d) {
        *best = Some((depth, path.to_string()));
    }
}

/// Whether `span` holds `at` (an empty `at` is a position: the byte it
/// points at lies in `span`).
fn holds(span: &Range<usize>, at: &Range<usize>) -> bool {
    if at.is_empty() {
        span.start <= at.start && at.start < span.end
    } else {
        span.start <= at.start && at.end <= span.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The [`Place`] of the position where `needle` first starts in `text`.
    fn at(text: &str, needle: &str) -> Place {
        let i = text.find(needle).expect(needle);
        place(text, &(i..i))
    }

    const DOC: &str = "name = \"x\"\n\n[datasets]\nnames = [\"gsm8k\"]\nsweep.topk = 3\n\n\
        [[variants]]\nmethod = \"ddtree\"\nsweep = { topk = [1, 2], budget = 4 }\n\n\
        [[variants]]\nmethod = \"y\"\n[variants.sub]\na = 1\ns = \"\"\"\n[not.a.header]\nb = 2\n\"\"\"\nc = 3\n";

    #[test]
    fn keys_and_values_are_named_by_their_full_path() {
        let cases = [
            ("\"x\"", "name", ""),
            ("\"gsm8k\"", "datasets.names[0]", "datasets"),
            ("topk = 3", "datasets.sweep.topk", "datasets"),
            ("3\n", "datasets.sweep.topk", "datasets"),
            ("\"ddtree\"", "variants[0].method", "variants[0]"),
            ("budget", "variants[0].sweep.budget", "variants[0]"),
            ("2]", "variants[0].sweep.topk[1]", "variants[0]"),
            ("\"y\"", "variants[1].method", "variants[1]"),
            // A sub-table of an array's element keeps the element's index.
            ("a = 1", "variants[1].sub.a", "variants[1].sub"),
            ("sub", "variants[1].sub", "variants[1].sub"),
            // A header-like line inside a multi-line string is part of the string.
            ("[not.a.header]", "variants[1].sub.s", "variants[1].sub"),
            ("c = 3", "variants[1].sub.c", "variants[1].sub"),
        ];
        for (needle, node, table) in cases {
            let got = at(DOC, needle);
            assert_eq!((got.node.as_deref(), got.table.as_str()), (Some(node), table), "at {needle:?}");
        }
    }

    #[test]
    fn a_header_is_its_tables_node_and_an_empty_range_a_position() {
        let i = DOC.find("[[variants]]").unwrap();
        assert_eq!(place(DOC, &(i..i + 12)).node.as_deref(), Some("variants[0]"));
        let j = DOC.rfind("[[variants]]").unwrap();
        assert_eq!(place(DOC, &(j..j)).node.as_deref(), Some("variants[1]"));
        // Between entries nothing holds the position; the table is the last header above.
        let blank = DOC.find("\n\n[[variants]]").unwrap() + 1;
        assert_eq!(place(DOC, &(blank..blank)), Place { node: None, key: None, table: "datasets".into() });
        // A header's own key: its node is the table, its key the key.
        let files = "[[dataset.files]]\nname = \"x\"\n";
        let got = at(files, "dataset");
        assert_eq!((got.node.as_deref(), got.key.as_deref()), (Some("dataset.files[0]"), Some("dataset")));
        assert_eq!(at(files, "files").key.as_deref(), Some("dataset.files"));
        // The keys of values are keys too, and a value holds no key.
        assert_eq!(at(DOC, "budget").key.as_deref(), Some("variants[0].sweep.budget"));
        assert_eq!(at(DOC, "4 }").key, None);
    }

    #[test]
    fn text_that_does_not_parse_is_placed_in_the_table_above() {
        let text = "name = \"x\"\n[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\nbad key = 1\n";
        let got = at(text, "key");
        assert_eq!(got.table, "models[1]");
        assert!(got.node.is_none(), "{got:?}");
        let top = "bad key = 1\n[datasets]\n";
        assert_eq!(at(top, "key").table, "");
    }
}
