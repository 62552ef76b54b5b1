//! Building a feature file: the index a build continues from, and the
//! target passes that append the features (and top-k rows) of the sequences
//! past it.

use super::*;
use bastion_models::Session;

/// The index a build continues from, cut to the sequences this data shares
/// with it (all of it, when the data on disk is shorter than it claims), and
/// the feature file, both cut on disk to what the index describes.
pub(super) fn prepare_build(
    dir: &Path,
    expected: &Index,
    files: BuildFiles<'_>,
    sequences: &[Vec<u32>],
    prefix: &[String],
) -> Result<(Index, File)> {
    let (path, top_path, index_path) = (files.data, files.top, files.index);
    let (width, top_k) = (expected.width, expected.top_k);
    let mut index = match read_index(index_path, expected)? {
        Some(index) => index,
        None => {
            if top_k == 0 {
                adopt_v1(dir, expected, (path, index_path), sequences, prefix)?;
            }
            read_index(index_path, expected)?.unwrap_or_else(|| expected.clone())
        }
    };
    // The sequences this data shares with the file; past a difference the file is
    // rebuilt for this data.
    let common = index
        .rows
        .iter()
        .zip(&index.prefix)
        .zip(sequences.iter().zip(prefix))
        .take_while(|((&rows, then), (s, now))| rows == s.len() && then == now)
        .count();
    if common < sequences.len() || index.rows.len() != index.prefix.len() {
        index.rows.truncate(common);
        index.prefix.truncate(common);
    }
    let file =
        OpenOptions::new().create(true).read(true).write(true).truncate(false).open(path).map_err(io_err(path))?;
    let top_file = if top_k > 0 {
        Some(
            OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(false)
                .open(top_path)
                .map_err(io_err(top_path))?,
        )
    } else {
        None
    };
    let top_short = match &top_file {
        Some(f) => f.metadata().map_err(io_err(top_path))?.len() < top_k_bytes(&index.rows, top_k),
        None => false,
    };
    if file.metadata().map_err(io_err(path))?.len() < data_bytes(&index.rows, width) || top_short {
        // The data the index describes is not all there: start over.
        index.rows.clear();
        index.prefix.clear();
    }
    // The index on disk never claims more than the data holds: cut it before the data.
    write_index(index_path, &index)?;
    // Drop whatever a crash wrote past the last indexed sequence, or the rows of
    // sequences this data parts from.
    file.set_len(data_bytes(&index.rows, width)).map_err(io_err(path))?;
    if let Some(f) = &top_file {
        f.set_len(top_k_bytes(&index.rows, top_k)).map_err(io_err(top_path))?;
    }
    Ok((index, file))
}

/// The files of a feature build: the f16 features, the top-k rows, the index.
#[derive(Clone, Copy)]
pub(super) struct BuildFiles<'a> {
    pub(super) data: &'a Path,
    pub(super) top: &'a Path,
    pub(super) index: &'a Path,
}

/// Appends the features (and top-`top_k` rows) of the sequences past
/// `index.rows.len()`, written in order, the data synced before the index
/// claims it (every 16,384 tokens and at the end). The tokens that all of
/// those sequences start with (distilled data's chat template) are prefilled
/// once, and each sequence's own tokens in a fork of that session: on `flex`
/// the same bits as a whole prefill ([`bastion_models::Session::fork`]).
/// Returns how many tokens were shared that way (0: none, or nothing to build).
#[allow(clippy::too_many_arguments)]
pub(super) fn append_features(
    target: &Model,
    cfg: &DrafterConfig,
    sequences: &[Vec<u32>],
    prefix: &[String],
    index: &mut Index,
    files: BuildFiles<'_>,
    top_k: usize,
    on_progress: &mut impl FnMut(usize, usize),
) -> Result<usize> {
    let (path, top_path, index_path) = (files.data, files.top, files.index);
    let width = index.width;
    let hidden = cfg.hidden_indices();
    let vocab = target.config().vocab_size;
    let total = sequences.len();
    let mut shared = 0;
    if index.rows.len() < total {
        let mut out = BufWriter::new(OpenOptions::new().append(true).open(path).map_err(io_err(path))?);
        let mut top_out = match top_k {
            0 => None,
            _ => Some(BufWriter::new(OpenOptions::new().append(true).open(top_path).map_err(io_err(top_path))?)),
        };
        // The rows of `tokens` prefilled into `session`: features `[T, width]` and top-k.
        let rows_of = |session: &mut Session<'_>, tokens: &[u32]| -> std::result::Result<Rows, String> {
            let fwd =
                if top_k > 0 { session.prefill_all_logits(tokens, &hidden) } else { session.prefill(tokens, &hidden) }
                    .and_then(bastion_models::Output::into_host)
                    .map_err(|e| e.to_string())?;
            let top = match top_k {
                0 => (Vec::new(), Vec::new()),
                _ => top_k_of(&fwd.logits, tokens.len(), vocab, top_k)?,
            };
            let feats = context_features(&fwd, target.config().hidden_size, None).map_err(|e| e.to_string())?;
            Ok(Rows { feats, top })
        };
        let first = index.rows.len();
        let todo = &sequences[first..];
        let heads: Vec<&[u32]> = todo.iter().map(Vec::as_slice).collect();
        shared = if todo.len() > 1 { crate::distill::shared_head(&heads) } else { 0 };
        let mut base = target.session();
        let pre = match shared {
            0 => Rows::default(),
            _ => rows_of(&mut base, &todo[0][..shared]).map_err(|e| {
                TrainError::Usage(format!(
                    "features of the {shared} tokens training sequences {first}.. start with: {e}"
                ))
            })?,
        };
        let mut since_sync = 0usize;
        for (i, tokens) in sequences.iter().enumerate().skip(first) {
            let bad = |e: String| TrainError::Usage(format!("features of training sequence {i}: {e}"));
            let own = match shared {
                0 => rows_of(&mut target.session(), tokens),
                _ => rows_of(&mut base.fork().map_err(|e| bad(e.to_string()))?, &tokens[shared..]),
            }
            .map_err(bad)?;
            if let Some(top_out) = &mut top_out {
                let bytes: Vec<u8> = [&pre.top, &own.top]
                    .into_iter()
                    .flat_map(|(ids, lps)| ids.iter().zip(lps))
                    .flat_map(|(id, lp)| id.to_le_bytes().into_iter().chain(lp.to_le_bytes()))
                    .collect();
                top_out.write_all(&bytes).map_err(io_err(top_path))?;
            }
            let feats = [pre.feats.as_slice(), &own.feats].concat();
            let halves: Vec<f16> = feats.iter().map(|&v| f16::from_f32(v)).collect();
            if let Some(j) = halves.iter().position(|h| !h.is_finite()) {
                return Err(bad(format!(
                    "feature {} of position {} is {}, outside f16's range: keep the features in memory (no \
                     feature cache)",
                    j % width,
                    j / width,
                    feats[j]
                )));
            }
            let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
            out.write_all(&bytes).map_err(io_err(path))?;
            index.rows.push(tokens.len());
            index.prefix.push(prefix[i].clone());
            since_sync += tokens.len();
            // Make the data durable before the index claims it.
            if since_sync >= 16_384 || index.rows.len() == total {
                out.flush().map_err(io_err(path))?;
                out.get_ref().sync_data().map_err(io_err(path))?;
                if let Some(top_out) = &mut top_out {
                    top_out.flush().map_err(io_err(top_path))?;
                    top_out.get_ref().sync_data().map_err(io_err(top_path))?;
                }
                write_index(index_path, index)?;
                since_sync = 0;
            }
            on_progress(index.rows.len(), total);
        }
    }
    Ok(shared)
}

/// A sequence's rows in a feature build: features `[T, width]` and, with
/// top-k, `(ids, log-probabilities)` `[T, k]`.
#[derive(Default)]
struct Rows {
    feats: Vec<f32>,
    top: (Vec<u32>, Vec<f32>),
}
