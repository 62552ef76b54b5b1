//! A long generation on the default model (the round edges at a stop token and the token limit, the
//! benchmark part): SmolLM2-135M with the shipped drafter decodes 1,000
//! tokens of a repetitive answer with every method at T = 0. The decoding
//! loop asserts after every round that the drafter's cached context equals
//! the committed one (`DecodeError::Invariant`); this checks every output
//! against AR's, that the rounds account for every token once, and reports τ
//! over the first and the second half of the output (does acceptance hold up
//! as the context grows?).
//!
//! ```sh
//! scripts/fetch-model.sh
//! cargo run --release -p bastion-decode --example long_generation -- [TOKENS] > results/long-generation.md
//! ```

use bastion_decode::{CalibrationSource, LoadedPair, Method, PairSpec};
use bastion_models::{BackendKind, Message};
use bastion_testkit::{repo_root, smollm2_drafter_dir, smollm2_gguf};

/// τ (tokens per drafted round, bonus included, emitted tokens only) over
/// the rounds whose first output position lies in `range`.
fn tau_over(rounds: &[bastion_decode::RoundRecord], range: std::ops::Range<usize>) -> (f64, usize) {
    let mut at = 1; // the prefill's token
    let (mut tokens, mut n) = (0, 0);
    for r in rounds {
        let e = r.emitted.unwrap_or(r.accepted);
        if range.contains(&at) && e > 0 {
            tokens += e;
            n += 1;
        }
        at += e;
    }
    (if n == 0 { 0.0 } else { tokens as f64 / n as f64 }, n)
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // On a worker of the CPU kernels' pool, as the `bastion` command runs.
    bastion_models::on_pool_worker(run)
}

fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let tokens: usize = std::env::args().nth(1).map_or(Ok(1000), |a| a.parse())?;
    let calibration = repo_root().join("results/calibration/amd-epyc-2-threads__smollm2-135m-instruct.q4-1__flex.json");
    let spec = PairSpec {
        drafter: Some(smollm2_drafter_dir()),
        calibration: Some(CalibrationSource::Pinned(calibration)),
        ..PairSpec::new(smollm2_gguf(), BackendKind::Flex)
    };
    let pair = LoadedPair::open(spec)?;
    let question = "Repeat this list exactly, separated by commas, again and again without stopping: \
                    alpha, beta, gamma, delta, epsilon, zeta, eta, theta.";
    let prompt = pair.chat_encoder(tokens + 16)?.encode(&[Message::new("user", question)])?;
    // No stop token: exactly `tokens` new tokens.
    let cfg = bastion_decode::GenerateConfig { max_new_tokens: tokens, ..Default::default() };
    let methods = [
        Method::Ar,
        Method::DFlash,
        Method::DDTree { budget: 16 },
        Method::DDTree { budget: 64 },
        Method::CaddTree,
        Method::BastionOnline,
        Method::Bastion,
    ];
    println!("# Long generation: SmolLM2-135M Q4_1 + shipped drafter, {tokens} tokens, T = 0\n");
    println!("Repetitive prompt: {question:?} ({} prompt tokens, flex, f32).", prompt.len());
    println!("`cargo run --release -p bastion-decode --example long_generation -- {tokens}`\n");
    println!("| method | rounds | τ | τ, first half | τ, second half | output = AR |");
    println!("|---|---:|---:|---:|---:|---|");
    let mut ar: Option<Vec<u32>> = None;
    let half = tokens / 2;
    for m in methods {
        let mut speculator = pair.speculator(m)?;
        let g = pair.generate(&mut speculator, &prompt, &cfg)?;
        assert_eq!(g.tokens.len(), tokens, "{m}: exactly the limit");
        let emitted: usize = g.rounds.iter().map(|r| r.emitted.unwrap_or(r.accepted)).sum();
        assert_eq!(emitted + 1, g.tokens.len(), "{m}: every token accounted for once");
        let same = ar.as_ref().is_none_or(|a| *a == g.tokens);
        assert!(same, "{m}: the output differs from AR's");
        let (first, _) = tau_over(&g.rounds, 0..half);
        let (second, _) = tau_over(&g.rounds, half..tokens + 1);
        println!("| {m} | {} | {:.2} | {first:.2} | {second:.2} | {same} |", g.rounds.len(), g.tau());
        ar.get_or_insert(g.tokens);
    }
    Ok(())
}
