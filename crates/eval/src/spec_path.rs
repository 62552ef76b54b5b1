//! Which field of an experiment file a deserialisation error is about, read
//! from the document as the TOML parser reads it: dotted keys
//! (`sweep.top_k = …`), inline tables, sub-tables of an array of tables and a
//! `[` at the start of a line inside a multi-line string are all placed where
//! TOML puts them, not where a line-by-line reading would.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The field an error of `toml::from_str` at byte range `at` of `text` with
/// `message` is about (`variants[0].sweep.top_k`, `models[1].name`,
/// `datasets.(syntax)`):
/// - an unknown field: the key the span points at;
/// - a missing field: the table the span is (its header, an inline table, or
///   the top level's empty span at 0) and the field's name;
/// - a duplicate key: the key the recovering parser kept in its place, else
///   the key as written in its inline table, under its table's header, or a
///   header's own path;
/// - a value of the wrong type or form: its key or value (a table where a
///   value goes is named by its header);
/// - text that does not parse: the table it lies in, then `(syntax)`.
pub(super) fn field(text: &str, at: &Range<usize>, message: &str) -> String {
    let named = |kind: &str| message.strip_prefix(kind).and_then(|m| m.split('`').nth(1));
    let place = place(text, at);
    let join = |table: &str, field: &str| if table.is_empty() { field.to_string() } else { format!("{table}.{field}") };
    let line_start = text.get(..at.start).and_then(|t| t.rfind('\n')).map_or(0, |i| i + 1);
    // A key spans only itself, so a key holding the span is what the error is about
    // (an implicit table such as `models` in `[models.tiny]` included).
    let here = place.key.clone().or_else(|| place.node.clone());
    match (named("unknown field"), named("missing field")) {
        (Some(key), _) => here.unwrap_or_else(|| join(&place.table, key)),
        (_, Some(key)) if at.is_empty() && at.start == 0 => key.to_string(),
        (_, Some(key)) => join(here.as_deref().unwrap_or(&place.table), key),
        _ if message.starts_with("duplicate key") => {
            let written = text.get(line_start..at.end).unwrap_or("").trim_start();
            match (&place.key, &place.node, written.strip_prefix('[')) {
                (Some(key), _, _) => key.clone(),
                (None, _, Some(header)) => dotted(header.trim_start_matches('[')),
                (None, Some(inline), None) => join(inline, text.get(at.clone()).unwrap_or("")),
                (None, None, None) => join(&place.table, &dotted(written)),
            }
        }
        _ => here.unwrap_or_else(|| join(&place.table, "(syntax)")),
    }
}

/// A dotted key as written (`x . y`), without the spaces around its dots.
fn dotted(key: &str) -> String {
    key.split('.').map(str::trim).collect::<Vec<_>>().join(".")
}

/// Where byte range `at` of `text` lies in the document.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Place {
    /// The path of the deepest key or value whose span holds `at`
    /// (`variants[0].sweep.top_k`, `models[1]`, `datasets.names[0]`); `None`
    /// where none does: between entries, past the last, in a key the parser
    /// rejected (a duplicate) or in text that does not parse.
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
    let mut walk = Walk { text, at: at.clone(), path: Vec::new(), node: None, key: None, table: None };
    walk.table(doc.get_ref());
    Place {
        node: walk.node.map(|(_, p)| p),
        key: walk.key.map(|(_, p)| p),
        table: walk.table.map(|(_, _, p)| p).unwrap_or_default(),
    }
}

/// One segment of a path: a key, or an index into an array.
enum Segment<'t> {
    Key(&'t str),
    Index(usize),
}

/// A search of the whole document (a header table's keys lie outside the
/// header's span, so every table is entered whatever its own span). It
/// recurses once per level; the parser keeps at most 80 (deeper text is a
/// "recursion limit" error and is not in the tree).
struct Walk<'t> {
    text: &'t str,
    at: Range<usize>,
    /// The segments from the top level to the node being visited.
    path: Vec<Segment<'t>>,
    /// (depth, path) of the deepest node holding `at` so far.
    node: Option<(usize, String)>,
    /// (depth, path) of the deepest key holding `at` so far.
    key: Option<(usize, String)>,
    /// (header start, depth, path) of the last header at or before `at`.
    table: Option<(usize, usize, String)>,
}

impl<'t> Walk<'t> {
    /// The entries of a table at the current path.
    fn table(&mut self, table: &'t DeTable<'t>) {
        for (key, value) in table {
            self.path.push(Segment::Key(key.get_ref()));
            if holds(&key.span(), &self.at) {
                let (depth, path) = (self.path.len(), self.path_text());
                deepest(&mut self.key, depth, &path);
                deepest(&mut self.node, depth, &path);
            }
            self.value(value);
            self.path.pop();
        }
    }

    /// The value at the current path, and everything inside it.
    fn value(&mut self, value: &'t Spanned<DeValue<'t>>) {
        let span = value.span();
        let depth = self.path.len();
        if holds(&span, &self.at) {
            let path = self.path_text();
            deepest(&mut self.node, depth, &path);
        }
        match value.get_ref() {
            DeValue::Table(table) => {
                // A header table's span is its header (`[x]`, `[[x]]`); an
                // inline or dotted-key table's starts with `{` or its key.
                let header = self.text.get(span.start..).is_some_and(|t| t.starts_with('['));
                let later = self.table.as_ref().is_none_or(|(s, d, _)| (span.start, depth) > (*s, *d));
                if header && span.start <= self.at.start && later {
                    self.table = Some((span.start, depth, self.path_text()));
                }
                self.table(table);
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.path.push(Segment::Index(i));
                    self.value(item);
                    self.path.pop();
                }
            }
            _ => {}
        }
    }

    /// The current path as text: `variants[0].sweep.top_k`.
    fn path_text(&self) -> String {
        let mut out = String::new();
        for segment in &self.path {
            match segment {
                Segment::Key(k) if out.is_empty() => out.push_str(k),
                Segment::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
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
#[path = "spec_path_tests.rs"]
mod tests;
