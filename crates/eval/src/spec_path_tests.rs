use super::*;

/// The [`Place`] of the position where `needle` first starts in `text`.
fn at(text: &str, needle: &str) -> Place {
    let i = text.find(needle).expect(needle);
    place(text, &(i..i))
}

/// The field `toml::from_str` names for `text`'s first error, with its
/// message, deserialised as `T`.
fn field_of<T: serde::de::DeserializeOwned>(text: &str) -> (String, String) {
    let e = toml::from_str::<T>(text).err().expect("an error");
    let span = e.span().unwrap_or(0..0);
    (field(text, &span, e.message()), e.message().to_string())
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

#[test]
fn a_key_deeper_than_the_parser_allows_is_no_node() {
    let deep = format!("{} = 1\n", vec!["a"; 20_000].join("."));
    assert_eq!(place(&deep, &(0..1)), Place::default());
}

/// A document shaped like an experiment file, every table closed to unknown fields.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Doc {
    name: Option<String>,
    datasets: Option<Sets>,
    models: Option<Vec<Model>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Sets {
    names: Option<Vec<String>>,
    sweep: Option<Sweep>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Sweep {
    top_k: Option<Vec<u32>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Model {
    name: String,
    extra: Option<Sweep>,
}

#[test]
fn every_kind_of_error_names_its_field() {
    let cases = [
        // Unknown fields, plain, dotted, in an inline table, a header's own key.
        ("[datasets]\nshuffle = true\n", "datasets.shuffle", "unknown field"),
        ("[datasets]\nsweep.lambda = [1]\n", "datasets.sweep.lambda", "unknown field"),
        ("[datasets]\nsweep = { top_k = [1], lambda = 2 }\n", "datasets.sweep.lambda", "unknown field"),
        ("[[dataset.files]]\nname = \"x\"\n", "dataset", "unknown field"),
        (
            "[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\n[models.extra]\nk = 1\n",
            "models[1].extra.k",
            "unknown field",
        ),
        // Missing fields: at the top level, in an element, in an inline element.
        ("[[models]]\nname = \"a\"\n[[models]]\n", "models[1].name", "missing field"),
        ("models = [{ name = \"a\" }, {}]\n", "models[1].name", "missing field"),
        // Wrong types: a value, an array's element, a table where a list goes (the
        // implicit table, not the header below it).
        ("[datasets]\nnames = \"gsm8k\"\n", "datasets.names", "invalid type"),
        ("[datasets]\nsweep.top_k = [1, \"2\"]\n", "datasets.sweep.top_k[1]", "invalid type"),
        ("[models.tiny]\nname = \"a\"\n", "models", "invalid type"),
        // Duplicates: plain, dotted, in an inline table, a header, a header after an array.
        ("name = \"a\"\nname = \"b\"\n", "name", "duplicate key"),
        ("[datasets]\nsweep.top_k = [1]\nsweep . top_k = [2]\n", "datasets.sweep.top_k", "duplicate key"),
        ("[datasets]\nsweep = { top_k = [1], top_k = [2] }\n", "datasets.sweep.top_k", "duplicate key"),
        ("[datasets]\nnames = []\n[datasets]\n", "datasets", "duplicate key"),
        ("name = \"a\"\nmodels = []\n[[models]]\nname = \"b\"\n", "models", "duplicate key"),
        // Text that does not parse: the table it lies in.
        ("[datasets]\nnames = [\n", "datasets.(syntax)", ""),
        ("[datasets]\nbad key = 1\n", "datasets.(syntax)", ""),
    ];
    for (text, want, message) in cases {
        let (got, said) = field_of::<Doc>(text);
        assert_eq!(got, want, "{text:?}: {said}");
        assert!(said.contains(message), "{text:?}: {said}");
    }
    // A field the top level lacks (the span is empty, at 0), even under a first-line table.
    assert_eq!(field_of::<Model>("[extra]\ntop_k = [1]\n").0, "name");
}
