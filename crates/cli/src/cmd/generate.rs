//! `bastion generate`: one generation with any method.

use std::io::Write;

use bastion_decode::{GenerateConfig, LoadedPair, MethodSpec};
use bastion_models::Message;

use super::{CostArgs, PairArgs, Result};

/// Generate from a prompt, autoregressively or speculatively; prints the text, τ and speed.
///
/// Generate with a target model, autoregressively or speculatively with a
/// DFlash drafter; prints the text, then (stderr) τ, TPOT and tokens/s
/// (prefill and first draft call excluded). Stops after --max-new-tokens or an
/// end-of-sequence token (the config's or the tokenizer's).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// The prompt text.
    #[arg(long, required_unless_present = "prompt_ids", conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids (comma-separated); the output is printed as ids too. For
    /// token-level reproduction and for models without a tokenizer.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Encode the prompt text as it is. By default a model with a chat template gets the prompt
    /// as one user turn of it, generation prompt added (as `run` and `tau` do, so τ compares).
    #[arg(long, conflicts_with_all = ["prompt_ids", "chat"])]
    raw: bool,
    /// Require the chat template (an error for a model without one); the default when it has one.
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: bool,
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128, value_parser = super::at_least_one())]
    max_new_tokens: usize,
    /// Decoding method: ar, dflash, ddtree:N, caddtree, bastion or bastion-online.
    #[arg(long, default_value = "ar", value_parser = super::method_arg)]
    method: MethodSpec,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, value_parser = super::temperature_arg)]
    temperature: f64,
    /// Seed of the sampler (T > 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    cost: CostArgs,
}

/// Runs `bastion generate`.
pub fn run(a: Args) -> Result {
    let pair = LoadedPair::open(a.pair.spec(a.method.method, Some(&a.cost))?)?;
    let mut speculator = pair.speculator(a.method.clone())?;
    let cfg = GenerateConfig { temperature: a.temperature, seed: a.seed, ..pair.generate_config(a.max_new_tokens) };
    let ids = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => {
            let vocab = pair.target().config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(
                    format!("--prompt-ids: token id {bad} is not below the target's vocabulary size {vocab}").into()
                );
            }
            ids.clone()
        }
        // The byte encoder of tokenizer-less models is for sweeps only: a tokenizer first.
        (Some(text), None) if !a.raw && (a.chat || pair.tokenizer()?.chat_template().is_some()) => {
            pair.chat_encoder(0)?.encode(&[Message::new("user", text)])?
        }
        (Some(text), None) => pair.tokenizer()?.encode(text, true)?,
        (None, None) => unreachable!("clap requires --prompt or --prompt-ids"),
    };
    let gen = pair.generate(&mut speculator, &ids, &cfg)?;
    if a.prompt_ids.is_some() {
        println!("{}", gen.tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(" "));
    } else {
        println!("{}", pair.tokenizer()?.decode(&gen.tokens, true)?);
    }
    std::io::stdout().flush()?;
    let tpot = gen.tpot();
    eprintln!(
        "{} | prompt {} tokens, prefill {:.3} s | {} tokens in {} rounds, τ {:.2}, TPOT {:.1} ms, {:.1} tokens/s, decode {:.4} s",
        a.method,
        ids.len(),
        gen.prefill_s,
        gen.tokens.len(),
        gen.rounds.len(),
        gen.tau(),
        tpot * 1e3,
        if tpot > 0.0 { 1.0 / tpot } else { 0.0 },
        gen.decode_s
    );
    Ok(())
}
