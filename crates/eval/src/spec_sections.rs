//! The sections of an experiment file, each checked on its own: run
//! settings (temperatures, seeds), methods, models, variants, datasets.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use bastion_data::{DatasetFile, DatasetName, FileLayout, PromptSource, Selection, UserName};
use bastion_decode::{BastionRule, Method, MethodSpec, Variant};
use bastion_models::{load_config, DrafterConfig};
use toml::Spanned;

use super::{nonempty, positive, Locator, ModelPair, RawDatasets, RawExperiment, SpecError, Subset, Turns};

/// `temperatures` (default `[0]`): each ≥ 0, none twice.
pub(super) fn temperatures(loc: &Locator<'_>, raw: Option<&Spanned<Vec<Spanned<f64>>>>) -> Result<Vec<f64>, SpecError> {
    Ok(match raw {
        None => vec![0.0],
        Some(list) => {
            nonempty(loc, list, "temperatures")?;
            let mut out = Vec::new();
            for (i, t) in list.get_ref().iter().enumerate() {
                // `+ 0.0` turns −0 into 0, so keys and the T = 0 checks agree.
                let v = *t.get_ref() + 0.0;
                if !(v.is_finite() && v >= 0.0) {
                    return Err(loc.at(
                        t.span(),
                        format!("temperatures[{i}]"),
                        format!("{v}: expected a temperature ≥ 0"),
                    ));
                }
                if out.contains(&v) {
                    return Err(loc.at(t.span(), format!("temperatures[{i}]"), format!("{v} is listed twice")));
                }
                out.push(v);
            }
            out
        }
    })
}

/// `seeds` (default `[0]`): each ≥ 0, none twice.
pub(super) fn seeds(loc: &Locator<'_>, raw: Option<&Spanned<Vec<Spanned<i64>>>>) -> Result<Vec<u64>, SpecError> {
    Ok(match raw {
        None => vec![0],
        Some(list) => {
            nonempty(loc, list, "seeds")?;
            let mut out = Vec::new();
            for (i, s) in list.get_ref().iter().enumerate() {
                let v = u64::try_from(*s.get_ref())
                    .map_err(|_| loc.at(s.span(), format!("seeds[{i}]"), "expected a seed ≥ 0"))?;
                if out.contains(&v) {
                    return Err(loc.at(s.span(), format!("seeds[{i}]"), format!("{v} is listed twice")));
                }
                out.push(v);
            }
            out
        }
    })
}

/// The `methods` list: names parsed into specs, `ddtree` expanded to the
/// budget grid, `ar` first unless the baseline is off.
pub(super) fn methods(loc: &Locator<'_>, raw: &RawExperiment, ar_baseline: bool) -> Result<Vec<MethodSpec>, SpecError> {
    // Methods: `ddtree` alone is the budget grid; `ar` runs first unless
    // the baseline is switched off.
    let no_methods = Spanned::new(0..0, Vec::new());
    let raw_methods = raw.methods.as_ref().unwrap_or(&no_methods);
    if raw.variants.is_none() {
        match &raw.methods {
            None => {
                return Err(loc.at(
                    0..0,
                    "methods",
                    "missing: expected methods = [\"ar\", \"dflash\", …] or [[variants]]",
                ))
            }
            Some(m) => nonempty(loc, m, "methods")?,
        }
    }
    let mut methods: Vec<MethodSpec> = if ar_baseline { vec![Method::Ar.into()] } else { Vec::new() };
    let (mut grid_used, mut ar_listed) = (false, false);
    for (i, m) in raw_methods.get_ref().iter().enumerate() {
        let field = format!("methods[{i}]");
        let s = m.get_ref().trim().to_ascii_lowercase();
        let expanded: Vec<MethodSpec> = if s == "ddtree" {
            grid_used = true;
            let grid = raw.ddtree_budgets.as_ref().ok_or_else(|| {
                loc.at(
                    m.span(),
                    &field,
                    "`ddtree` runs the budget grid: add ddtree_budgets = [8, 16, …] (or name one budget, ddtree:N)",
                )
            })?;
            nonempty(loc, grid, "ddtree_budgets")?;
            let mut out = Vec::new();
            for (j, b) in grid.get_ref().iter().enumerate() {
                let v = *b.get_ref();
                let method = Method::ddtree(usize::try_from(v).unwrap_or(0))
                    .map_err(|why| loc.at(b.span(), format!("ddtree_budgets[{j}]"), format!("budget {v}: {why}")))?;
                out.push(method.into());
            }
            out
        } else {
            vec![s.parse::<MethodSpec>().map_err(|e| loc.at(m.span(), &field, e.to_string()))?]
        };
        for method in expanded {
            let is_ar = method.method == Method::Ar;
            if is_ar && !ar_baseline {
                return Err(loc.at(m.span(), &field, "ar is listed but ar_baseline = false"));
            }
            let twice = if is_ar { std::mem::replace(&mut ar_listed, true) } else { methods.contains(&method) };
            if twice {
                // An earlier release's file listing both `bastion` (then online) and
                // `bastion-paper`: say what moved rather than only that it repeats.
                let spelled = |m: &Spanned<String>| m.get_ref().trim().to_ascii_lowercase();
                let respelled = !raw_methods.get_ref()[..i].iter().any(|earlier| spelled(earlier) == s);
                let why = match Method::deprecation(&s).filter(|_| respelled) {
                    Some(note) => format!("method {method} is listed twice: {note}"),
                    None => format!("method {method} is listed twice"),
                };
                return Err(loc.at(m.span(), &field, why));
            }
            if !is_ar {
                methods.push(method);
            }
        }
    }
    if let (Some(grid), false) = (&raw.ddtree_budgets, grid_used) {
        return Err(loc.at(grid.span(), "ddtree_budgets", "set but unused: add \"ddtree\" to methods"));
    }

    Ok(methods)
}

/// The `[[models]]`: unique names, existing files, drafters that fit their
/// target, a window that holds `max_new_tokens` and a block; with the
/// smallest drafter block size.
pub(super) fn models(
    loc: &Locator<'_>,
    raw: &RawExperiment,
    base: &Path,
    max_new_tokens: usize,
) -> Result<(Vec<ModelPair>, Option<usize>), SpecError> {
    // Models: unique names, existing files, drafters that fit their target.
    nonempty(loc, &raw.models, "models")?;
    let mut models = Vec::new();
    let mut names = HashSet::new();
    let mut block_size: Option<usize> = None;
    for (i, m) in raw.models.get_ref().iter().enumerate() {
        let n = m.name.get_ref().trim().to_string();
        if n.is_empty() || !names.insert(n.clone()) {
            return Err(loc.at(
                m.name.span(),
                format!("models[{i}].name"),
                format!("`{n}`: expected a unique, non-empty name"),
            ));
        }
        let path = |s: &Spanned<String>, what: &str, want: &str| -> Result<PathBuf, SpecError> {
            let p = base.join(s.get_ref());
            if p.exists() {
                Ok(p)
            } else {
                Err(loc.at(
                    s.span(),
                    format!("models[{i}].{what}"),
                    format!("{} does not exist: expected {want}", s.get_ref()),
                ))
            }
        };
        let target = path(
            &m.target,
            "target",
            "a .gguf file or a Hugging Face folder (scripts/fetch-model.sh fetches the default one)",
        )?;
        let drafter = path(
            &m.drafter,
            "drafter",
            "a DFlash drafter: a folder (config.json + model.safetensors) or its GGUF (`bastion export-gguf`)",
        )?;
        let calibration =
            m.calibration.as_ref().map(|c| path(c, "calibration", "a file from `bastion profile`")).transpose()?;
        // Read now, so that a bad file stops the sweep before any model runs (whether it
        // fits this pair and device is checked when the pair loads).
        if let (Some(c), Some(file)) = (&m.calibration, &calibration) {
            bastion_decode::Calibration::load(file)
                .map_err(|e| loc.at(c.span(), format!("models[{i}].calibration"), e.to_string()))?;
        }
        let tcfg =
            load_config(&target).map_err(|e| loc.at(m.target.span(), format!("models[{i}].target"), e.to_string()))?;
        let dcfg = DrafterConfig::read(&drafter, tcfg.num_layers)
            .and_then(|(d, dcfg_path)| d.check_target(&dcfg_path, &tcfg).map(|()| d))
            .map_err(|e| {
                loc.at(
                    m.drafter.span(),
                    format!("models[{i}].drafter"),
                    format!("does not fit target {}: {e}", m.target.get_ref()),
                )
            })?;
        block_size = Some(block_size.map_or(dcfg.block_size, |b| b.min(dcfg.block_size)));
        // A generation needs the prompt, the new tokens and one block in the window.
        if max_new_tokens + dcfg.block_size >= tcfg.max_position_embeddings {
            return Err(loc.at(
                raw.max_new_tokens.span(),
                "max_new_tokens",
                format!(
                    "{max_new_tokens} + block size {} leaves no room for a prompt in the {} positions of {}",
                    dcfg.block_size,
                    tcfg.max_position_embeddings,
                    m.target.get_ref()
                ),
            ));
        }
        let draft_vocab = match &m.draft_vocab {
            None => None,
            Some(n) => {
                let at = |why: String| loc.at(n.span(), format!("models[{i}].draft_vocab"), why);
                let size = usize::try_from(*n.get_ref())
                    .ok()
                    .filter(|&v| v >= 1)
                    .ok_or_else(|| at(format!("expected a token count ≥ 1, found {}", n.get_ref())))?;
                let file = bastion_models::draft_vocab_path(&drafter);
                bastion_models::DraftVocabFile::read(&file)
                    .and_then(|v| v.top(size, tcfg.vocab_size, &file))
                    .map_err(|e| at(format!("{e} (`bastion draft-vocab` writes the file)")))?;
                Some(size)
            }
        };
        let dtype = m.dtype.as_ref().map_or(bastion_models::WeightDtype::F32, |d| d.get_ref().0);
        models.push(ModelPair { name: n, target, drafter, calibration, draft_vocab, dtype });
    }

    Ok((models, block_size))
}

/// The plain methods as variants, then the `[[variants]]` tables resolved
/// ([`crate::variants::resolve`]), with the scopes of those that do not run
/// everywhere.
pub(super) fn variants(
    loc: &Locator<'_>,
    raw: &RawExperiment,
    methods: Vec<MethodSpec>,
    bounds: (Option<usize>, BastionRule),
    experiment: (&[String], &[f64]),
) -> Result<(Vec<Variant>, std::collections::BTreeMap<String, crate::variants::Scope>), SpecError> {
    let mut methods: Vec<Variant> = methods.into_iter().map(Variant::plain).collect();
    let mut scopes = std::collections::BTreeMap::new();
    if let Some(v) = &raw.variants {
        let mut taken: Vec<String> = methods.iter().map(|m| m.label.clone()).collect();
        for (variant, scope) in crate::variants::resolve(loc, v.get_ref(), bounds, experiment, &mut taken)? {
            if scope != crate::variants::Scope::default() {
                scopes.insert(variant.label.clone(), scope);
            }
            methods.push(variant);
        }
    }
    if methods.iter().all(|m| m.spec.method == Method::Ar) {
        let span = raw.methods.as_ref().map_or(0..0, |m| m.span());
        return Err(loc.at(span, "methods", "expected at least one method besides ar"));
    }

    Ok((methods, scopes))
}

/// The `[datasets]` table: built-in names and the user's files (at least
/// one set, none twice; a file's path resolved against `base` and present),
/// the subset rule and the turns.
pub(super) fn datasets(
    loc: &Locator<'_>,
    d: &Spanned<RawDatasets>,
    base: &Path,
) -> Result<(Vec<DatasetName>, Vec<DatasetFile>, Selection, bool), SpecError> {
    let (names, files) = (d.get_ref().names.as_ref(), d.get_ref().files.as_ref());
    if names.is_none_or(|n| n.get_ref().is_empty()) && files.is_none_or(|f| f.get_ref().is_empty()) {
        let span = names.map_or(d.span(), Spanned::span);
        return Err(loc.at(span, "datasets.names", "expected at least one set (names, or [[datasets.files]])"));
    }
    let mut datasets = Vec::new();
    for (i, n) in names.map_or(&[][..], |n| n.get_ref().as_slice()).iter().enumerate() {
        let field = format!("datasets.names[{i}]");
        let name: DatasetName = n.get_ref().parse().map_err(|e| loc.at(n.span(), &field, format!("{e}")))?;
        if datasets.contains(&name) {
            return Err(loc.at(n.span(), &field, format!("{} is listed twice", name.as_str())));
        }
        datasets.push(name);
    }
    let mut user = Vec::new();
    for (i, f) in files.map_or(&[][..], |f| f.get_ref().as_slice()).iter().enumerate() {
        let field = |k: &str| format!("datasets.files[{i}].{k}");
        let sources: Vec<(&str, &Spanned<String>)> =
            [("prompt", &f.prompt), ("turns", &f.turns), ("template", &f.template)]
                .into_iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                .collect();
        if let [_, (k, v), ..] = sources[..] {
            return Err(loc.at(v.span(), field(k), "expected one of prompt, turns and template, not several"));
        }
        let prompt = sources.first().map(|&(k, v)| {
            let v = v.get_ref().clone();
            match k {
                "prompt" => PromptSource::Field(v),
                "turns" => PromptSource::Turns(v),
                _ => PromptSource::Template(v),
            }
        });
        let layout = f.layout.as_ref().map_or(FileLayout::Generic, |l| l.get_ref().0);
        let path = base.join(f.path.get_ref());
        if !path.is_file() {
            let what = if path.exists() { "is not a file" } else { "does not exist" };
            return Err(loc.at(
                f.path.span(),
                field("path"),
                format!("{} {what}: expected a JSONL file, one record per line", f.path.get_ref()),
            ));
        }
        UserName::new(f.name.get_ref()).map_err(|e| loc.at(f.name.span(), field("name"), e.to_string()))?;
        // With a valid name, what is left to refuse is the prompt: none given, or a
        // template that does not parse.
        let file = DatasetFile::new(f.name.get_ref(), path, layout, prompt, f.id.as_ref().map(|v| v.get_ref().clone()))
            .map_err(|e| {
                let (k, span) = sources.first().map_or(("prompt", f.name.span()), |&(k, v)| (k, v.span()));
                loc.at(span, field(k), e.to_string())
            })?;
        if datasets.contains(&file.name) {
            return Err(loc.at(f.name.span(), field("name"), format!("{} is listed twice", file.name)));
        }
        datasets.push(file.name.clone());
        user.push(file);
    }
    let d = d.get_ref();
    let paper_subset = d.subset.as_ref().is_none_or(|s| s.get_ref().0 == Subset::Paper);
    let max_samples = d.max_samples.as_ref().map(|m| positive(loc, m, "datasets.max_samples")).transpose()?;
    let first_turn_only = d.turns.as_ref().is_some_and(|t| t.get_ref().0 == Turns::First);
    let per_group = match &d.per_group {
        None => None,
        Some(n) => {
            let n_span = n.span();
            let n = positive(loc, n, "datasets.per_group")?;
            if let Some(other) = datasets.iter().find(|s| **s != DatasetName::SpecBench) {
                return Err(loc.at(
                    n_span,
                    "datasets.per_group",
                    format!("a per-group subset needs sets with task groups (spec-bench), and {other} has none"),
                ));
            }
            Some(n)
        }
    };
    Ok((datasets, user, Selection { paper_subset, max_samples, per_group }, first_turn_only))
}
