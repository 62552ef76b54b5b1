//! `bastion export-gguf`: a Bastion drafter as llama.cpp's `dflash` GGUF.

use std::path::PathBuf;

use bastion_models::{export_drafter_gguf, WeightDtype};

use super::Result;

/// Export a DFlash drafter as llama.cpp's `dflash` GGUF.
///
/// Write a DFlash drafter (z-lab layout: config.json + model.safetensors, as
/// `bastion train-drafter` writes it) as llama.cpp's `dflash` GGUF, for its
/// speculative mode `--spec-type draft-dflash` next to the target GGUF. The
/// target's tokenizer is copied in, target layer ids are written as llama.cpp
/// counts them (z-lab's + 1), norms stay f32. Refuses, naming the field, what
/// llama.cpp cannot run (a target layer id equal to the target's last layer,
/// a mask id outside the vocabulary, a drafter that does not fit the target).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The drafter folder.
    #[arg(long)]
    drafter: PathBuf,
    /// The target's .gguf file (its tokenizer goes into the drafter's file).
    #[arg(long)]
    target: PathBuf,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// The linear layers' weights: f32, f16 or q8_0.
    #[arg(long, default_value = "f16")]
    dtype: WeightDtype,
}

/// Runs `bastion export-gguf`.
pub fn run(a: Args) -> Result {
    let e = export_drafter_gguf(&a.drafter, &a.target, &a.out, a.dtype)?;
    let layers: Vec<String> = e.target_layers.iter().map(u32::to_string).collect();
    eprintln!(
        "wrote {} ({} tensors, {:.1} MB, {} weights; dflash.target_layers = [{}])",
        e.path.display(),
        e.tensors,
        e.bytes as f64 / 1e6,
        a.dtype,
        layers.join(", ")
    );
    Ok(())
}
