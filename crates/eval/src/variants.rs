//! Method variants of an experiment file: `[[variants]]`
//! tables that name a method with some of its knobs set, and `sweep.<knob>
//! = [...]` lists that expand one variant per value.
//!
//! ```toml
//! [[variants]]
//! name = "online-l05"           # the row label ([a-z0-9][a-z0-9_.+-]*, not a method name)
//! method = "bastion-online"     # any speculative method; ddtree names its budget (ddtree:16)
//! online_forgetting = 0.5       # knobs: bastion_decode::MethodParams
//!
//! [[variants]]
//! name = "ddtree16-topk"
//! method = "ddtree:16"
//! sweep.top_k = [2, 4, 16]      # three rows: ddtree16-topk[top_k=2], …
//! ```
//!
//! `models = ["…"]` and `temperatures = [...]` run a variant only on some of
//! the experiment's model pairs and temperatures (AR runs everywhere), so
//! one file can hold a T = 0 sweep and a T > 0 comparison without running
//! every row at every setting.
//!
//! Several swept knobs expand to every combination; labels list them in
//! the order of [`MethodParams::knob_names`].

use bastion_decode::{Method, MethodParams, MethodSpec, Variant, KNOB_NAMES};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use crate::spec::{Locator, SpecError};

/// Knobs of a `[[variants]]` table (or of its `sweep`), each as written,
/// by name (typed when the variant is resolved, so a mistyped value names
/// its own position). Read by name against [`bastion_decode::KNOBS`], so a
/// new knob needs nothing here.
pub(crate) struct RawKnobs<T>(Vec<(&'static str, T)>);

impl<T> Default for RawKnobs<T> {
    fn default() -> Self {
        RawKnobs(Vec::new())
    }
}

/// A key of a table of knobs: one of `fields`, else a knob's name (as a
/// seed, so that an unknown key's error carries the key's position).
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = &'static str;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static str, D::Error> {
        let key = String::deserialize(d)?;
        let known = self.0.iter().chain(KNOB_NAMES).copied().find(|k| *k == key);
        known.ok_or_else(|| {
            let expected: Vec<String> = self.0.iter().chain(KNOB_NAMES).map(|f| format!("`{f}`")).collect();
            de::Error::custom(format!("unknown field `{key}`, expected one of {}", expected.join(", ")))
        })
    }
}

impl<T> RawKnobs<T> {
    /// The knobs that are set, by name, in [`MethodParams::knob_names`] order.
    fn set(&self) -> Vec<(&'static str, &T)> {
        let mut set: Vec<(&'static str, &T)> = self.0.iter().map(|(k, v)| (*k, v)).collect();
        set.sort_by_key(|(k, _)| KNOB_NAMES.iter().position(|n| n == k));
        set
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for RawKnobs<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Visit<T> {
            type Value = RawKnobs<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table of knobs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut knobs = RawKnobs::default();
                while let Some(knob) = map.next_key_seed(Key(&[]))? {
                    knobs.0.push((knob, map.next_value()?));
                }
                Ok(knobs)
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// The knobs a variant sets directly, by name, as written.
type DirectKnobs<'v> = Vec<(&'static str, &'v Spanned<toml::Value>)>;

/// A `sweep.<knob>` list as written.
type SweptValues = Spanned<Vec<Spanned<toml::Value>>>;

/// One expanded combination: its label, its knobs, and per knob the span
/// and field of the value that set it (for range errors).
type Combo<'a> = (String, toml::Table, Vec<(&'a str, std::ops::Range<usize>, String)>);

/// One `[[variants]]` table as written: its fields, and the knobs set
/// directly beside them (read by name: serde's `flatten` would lose the
/// values' spans).
pub(crate) struct RawVariant {
    name: Spanned<String>,
    method: Spanned<String>,
    sweep: Option<Spanned<RawKnobs<SweptValues>>>,
    models: Option<Spanned<Vec<Spanned<String>>>>,
    temperatures: Option<Spanned<Vec<Spanned<f64>>>>,
    knobs: RawKnobs<Spanned<toml::Value>>,
}

/// The fields of a `[[variants]]` table besides its knobs.
const VARIANT_FIELDS: [&str; 5] = ["name", "method", "sweep", "models", "temperatures"];

impl<'de> Deserialize<'de> for RawVariant {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = RawVariant;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a [[variants]] table")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawVariant, A::Error> {
                let (mut name, mut method, mut sweep, mut models, mut temperatures) = (None, None, None, None, None);
                let mut knobs = RawKnobs::default();
                while let Some(key) = map.next_key_seed(Key(&VARIANT_FIELDS))? {
                    match key {
                        "name" => name = Some(map.next_value()?),
                        "method" => method = Some(map.next_value()?),
                        "sweep" => sweep = Some(map.next_value()?),
                        "models" => models = Some(map.next_value()?),
                        "temperatures" => temperatures = Some(map.next_value()?),
                        knob => knobs.0.push((knob, map.next_value()?)),
                    }
                }
                Ok(RawVariant {
                    name: name.ok_or_else(|| de::Error::missing_field("name"))?,
                    method: method.ok_or_else(|| de::Error::missing_field("method"))?,
                    sweep,
                    models,
                    temperatures,
                    knobs,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

impl RawVariant {
    /// The `method` as written.
    pub(crate) fn method(&self) -> &Spanned<String> {
        &self.method
    }
}

/// Whether `label` may label a variant: `[a-z0-9][a-z0-9_.+-]*` (it goes
/// into store keys, table rows and file names).
fn valid_label(label: &str) -> bool {
    label.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.+-".contains(c))
}

/// A knob's value as it appears in a swept label (`0.5`, `raw`).
fn label_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Sets `knob` to `value` in `table` after checking that the value has
/// the knob's type.
fn typed(
    loc: &Locator<'_>,
    table: &mut toml::Table,
    knob: &str,
    value: &Spanned<toml::Value>,
    field: String,
) -> Result<(), SpecError> {
    let mut one = toml::Table::new();
    one.insert(knob.to_string(), value.get_ref().clone());
    one.try_into::<MethodParams>()
        .map_err(|e| loc.at(value.span(), field, format!("{}: {}", value.get_ref(), e.message().trim())))?;
    table.insert(knob.to_string(), value.get_ref().clone());
    Ok(())
}

/// Where a variant runs: `None` = every model pair / temperature of the experiment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    /// The model pairs (by name) it runs on.
    pub models: Option<Vec<String>>,
    /// The temperatures it runs at.
    pub temperatures: Option<Vec<f64>>,
}

impl Scope {
    /// Whether a variant with this scope runs on `model` at `temperature`.
    pub fn covers(&self, model: &str, temperature: f64) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|x| x == model))
            && self.temperatures.as_ref().is_none_or(|t| t.contains(&temperature))
    }

    fn is_everywhere(&self) -> bool {
        self.models.is_none() && self.temperatures.is_none()
    }
}

/// Resolves the `[[variants]]` tables into labelled variants, swept knobs
/// expanded, every knob typed and checked against its method
/// ([`MethodParams::check`]; `block_size`: the smallest drafter block of
/// the experiment's models; `rule`: the experiment's BASTION rule), each with its [`Scope`] (checked against the
/// experiment's `models` names and `temperatures`). `taken` holds the
/// labels already used (the plain methods'); the new labels are added.
///
/// # Errors
/// [`SpecError`] at the offending name, method or value: a label that is
/// malformed, a method name or used twice; `ar` or the `ddtree` grid as a
/// variant's method; a variant that sets no knob; a knob the method does
/// not read, of the wrong type or out of range; a knob both set and swept;
/// an empty sweep; a scope naming a model or temperature the experiment
/// does not have.
pub(crate) fn resolve(
    loc: &Locator<'_>,
    raw: &[RawVariant],
    (block_size, rule): (Option<usize>, bastion_decode::BastionRule),
    experiment: (&[String], &[f64]),
    taken: &mut Vec<String>,
) -> Result<Vec<(Variant, Scope)>, SpecError> {
    let mut out = Vec::new();
    for (i, v) in raw.iter().enumerate() {
        let at = |what: &str| format!("variants[{i}].{what}");
        let scope = scope_of(loc, v, experiment, i)?;
        let name = label_of(loc, v, &at)?;
        let named = method_of(loc, v, &at)?;
        let method = named.method;
        let (base, direct) = direct_knobs(loc, v, &named, &at)?;
        // Swept knobs: each value typed, then every combination.
        let swept = v.sweep.as_ref().map(|s| s.get_ref().set()).unwrap_or_default();
        for (knob, values) in &swept {
            let field = at(&format!("sweep.{knob}"));
            if base.contains_key(*knob) {
                return Err(loc.at(values.span(), field, format!("`{knob}` is both set and swept")));
            }
            if values.get_ref().is_empty() {
                return Err(loc.at(values.span(), field, "expected at least one value"));
            }
        }
        if direct.is_empty() && swept.is_empty() && scope.is_everywhere() {
            return Err(loc.at(
                v.name.span(),
                at("name"),
                format!(
                    "`{name}` sets no knob and no scope: list {named} in methods instead, or set one of {}",
                    MethodParams::knob_names().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let spans = direct.iter().map(|(k, val)| (*k, val.span(), at(k))).collect();
        let combos = expand_sweeps(loc, vec![(name, base, spans)], &swept, &at)?;
        for (label, table, spans) in combos {
            let params: MethodParams =
                table.try_into().map_err(|e| loc.at(v.name.span(), at("name"), e.message().trim().to_string()))?;
            if let Err((knob, why)) = params.check(method, block_size, rule) {
                // Point at the value that is out of range (the last one of that knob).
                let (span, field) = spans
                    .iter()
                    .rev()
                    .find(|(k, _, _)| *k == knob)
                    .map_or((v.method.span(), at("method")), |(_, s, f)| (s.clone(), f.clone()));
                return Err(loc.at(span, field, why));
            }
            if taken.contains(&label) {
                return Err(loc.at(v.name.span(), at("name"), format!("label `{label}` is used twice")));
            }
            taken.push(label.clone());
            out.push((Variant { label, spec: MethodSpec::new(method, params) }, scope.clone()));
        }
    }
    Ok(out)
}

/// The variant's label, checked: well formed, not an oracle row's, not a method's name.
fn label_of(loc: &Locator<'_>, v: &RawVariant, at: &dyn Fn(&str) -> String) -> Result<String, SpecError> {
    let name = v.name.get_ref().trim().to_string();
    let refuse = |why: String| Err(loc.at(v.name.span(), at("name"), why));
    if !valid_label(&name) {
        return refuse(format!("`{name}`: expected [a-z0-9][a-z0-9_.+-]* (it labels the variant's rows)"));
    }
    if name.starts_with(crate::tables::ORACLE) {
        return refuse(format!("`{name}`: labels starting with {} are the tables' oracle rows", crate::tables::ORACLE));
    }
    if name.parse::<MethodSpec>().is_ok() {
        return refuse(format!("`{name}` is a method's name; a variant needs a label of its own (e.g. {name}-k4)"));
    }
    Ok(name)
}

/// The variant's method as named (with the knob its name sets, `+skip`):
/// a speculative method, DDTree with its budget.
fn method_of(loc: &Locator<'_>, v: &RawVariant, at: &dyn Fn(&str) -> String) -> Result<MethodSpec, SpecError> {
    let m = v.method.get_ref().trim().to_ascii_lowercase();
    if m == "ddtree" {
        return Err(loc.at(v.method.span(), at("method"), "a variant names one DDTree budget: ddtree:N"));
    }
    let named: MethodSpec =
        m.parse().map_err(|e: bastion_decode::DecodeError| loc.at(v.method.span(), at("method"), e.to_string()))?;
    if named.method == Method::Ar {
        return Err(loc.at(v.method.span(), at("method"), "ar has no knobs: a variant needs a speculative method"));
    }
    Ok(named)
}

/// The knobs the method's name sets (`+skip`), then those set directly,
/// typed one by one; and the direct ones as written.
fn direct_knobs<'v>(
    loc: &Locator<'_>,
    v: &'v RawVariant,
    named: &MethodSpec,
    at: &dyn Fn(&str) -> String,
) -> Result<(toml::Table, DirectKnobs<'v>), SpecError> {
    let mut base = toml::Table::new();
    if let Some(skip) = named.params.skip {
        base.insert("skip".into(), toml::Value::Boolean(skip));
    }
    let direct = v.knobs.set();
    for (knob, value) in &direct {
        if base.contains_key(*knob) {
            return Err(loc.at(
                value.span(),
                at(knob),
                format!("`{knob}` is already set by the method's name `{named}`"),
            ));
        }
        typed(loc, &mut base, knob, value, at(knob))?;
    }
    Ok((base, direct))
}

/// Every combination of the swept values over `combos`, each value typed,
/// labels extended with `[knob=value,…]`.
fn expand_sweeps<'a>(
    loc: &Locator<'_>,
    mut combos: Vec<Combo<'a>>,
    swept: &[(&'a str, &SweptValues)],
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<Combo<'a>>, SpecError> {
    for (knob, values) in swept {
        let mut next = Vec::new();
        for (label, table, spans) in &combos {
            for (j, value) in values.get_ref().iter().enumerate() {
                let field = at(&format!("sweep.{knob}[{j}]"));
                let mut t = table.clone();
                typed(loc, &mut t, knob, value, field.clone())?;
                let label = match label.strip_suffix(']') {
                    Some(open) => format!("{open},{knob}={}]", label_value(value.get_ref())),
                    None => format!("{label}[{knob}={}]", label_value(value.get_ref())),
                };
                let mut s = spans.clone();
                s.push((*knob, value.span(), field));
                next.push((label, t, s));
            }
        }
        combos = next;
    }
    Ok(combos)
}

/// The [`Scope`] of variant `i`, every model name and temperature checked
/// against the experiment's.
fn scope_of(
    loc: &Locator<'_>,
    v: &RawVariant,
    (models, temperatures): (&[String], &[f64]),
    i: usize,
) -> Result<Scope, SpecError> {
    let mut scope = Scope::default();
    if let Some(list) = &v.models {
        if list.get_ref().is_empty() {
            return Err(loc.at(list.span(), format!("variants[{i}].models"), "expected at least one model name"));
        }
        let mut names = Vec::new();
        for (j, m) in list.get_ref().iter().enumerate() {
            let name = m.get_ref().trim();
            if !models.iter().any(|x| x == name) {
                return Err(loc.at(
                    m.span(),
                    format!("variants[{i}].models[{j}]"),
                    format!("`{name}` is not a model of this experiment (expected one of {})", models.join(", ")),
                ));
            }
            names.push(name.to_string());
        }
        scope.models = Some(names);
    }
    if let Some(list) = &v.temperatures {
        if list.get_ref().is_empty() {
            return Err(loc.at(
                list.span(),
                format!("variants[{i}].temperatures"),
                "expected at least one temperature",
            ));
        }
        let mut ts = Vec::new();
        for (j, t) in list.get_ref().iter().enumerate() {
            let value = *t.get_ref() + 0.0;
            if !temperatures.contains(&value) {
                return Err(loc.at(
                    t.span(),
                    format!("variants[{i}].temperatures[{j}]"),
                    format!("{value} is not among the experiment's temperatures {temperatures:?}"),
                ));
            }
            ts.push(value);
        }
        scope.temperatures = Some(ts);
    }
    Ok(scope)
}
