//! A calibration's fit as `bastion profile` prints it.

use super::*;

impl Calibration {
    /// The fit against the measurements, as text: per grid point the
    /// measured verify time beside BASTION's roofline and CaDDTree's convex
    /// curves (ms), then the fitted α/β with both fits' RMSE and the
    /// drafter's round constants (what `bastion profile` prints).
    ///
    /// # Errors
    /// [`DecodeError::Tree`] when the stored CaDDTree curves do not form a cost model.
    pub fn fit_report(&self) -> Result<String> {
        use std::fmt::Write;
        let roofline = self.roofline();
        let f = &self.fit.caddtree;
        let cost = ConvexCostModel::from_curves(0.0, f.contexts.clone(), f.curves.clone())?;
        let mut out =
            format!("{:>6} {:>6} {:>11} {:>13} {:>13}\n", "c", "s", "measured ms", "roofline ms", "CaDDTree ms");
        for p in &self.verify {
            let _ = writeln!(
                out,
                "{:>6} {:>6} {:>11.2} {:>13.2} {:>13.2}",
                p.context_len,
                p.tokens,
                p.seconds * 1e3,
                roofline.at_context(p.context_len).estimate(p.tokens) * 1e3,
                bastion_tree::RoundCostModel::verify_seconds(&cost, p.tokens - 1, p.context_len) * 1e3
            );
        }
        let k = &self.fit.roofline;
        let _ = writeln!(
            out,
            "roofline: α_c {:.3}, β_c {:.3} ms, α_m {:.3}, β_m {:.3} ms over {:.1} GFLOP/s, {:.1} GB/s; RMSE {:.2} ms \
             (CaDDTree curves: {:.2} ms)",
            k.alpha_c,
            k.beta_c * 1e3,
            k.alpha_m,
            k.beta_m * 1e3,
            self.device.peak.peak_flops / 1e9,
            self.device.peak.bandwidth / 1e9,
            self.fit.roofline_rmse_seconds * 1e3,
            self.fit.caddtree_rmse_seconds * 1e3
        );
        if let Some(d) = &self.drafter {
            let _ = writeln!(
                out,
                "drafter (block {}): T_d {:.2} ms, T_nv {:.2} ms",
                d.block_size,
                d.draft_seconds * 1e3,
                d.non_verify_seconds * 1e3
            );
            if !d.drafted_seconds.is_empty() {
                let times: Vec<String> = d.drafted_seconds.iter().map(|t| format!("{:.2}", t * 1e3)).collect();
                let _ = writeln!(
                    out,
                    "drafting only the root and d = 1 … {} rows: T_d {} ms",
                    times.len(),
                    times.join(" / ")
                );
            }
        }
        Ok(out)
    }
}
