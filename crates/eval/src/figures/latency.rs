//! The calibration's figure: verify latency against tree size (`bastion profile`).

use std::path::Path;

use bastion_decode::Calibration;
use bastion_tree::RoundCostModel;
use plotters::prelude::*;

use super::COLORS;
use crate::error::OutputError;

/// Up to `k` context lengths of `all`, spread evenly, first and last included.
fn spread(all: &[usize], k: usize) -> Vec<usize> {
    if all.len() <= k {
        return all.to_vec();
    }
    let mut out: Vec<usize> = (0..k).map(|i| all[i * (all.len() - 1) / (k - 1)]).collect();
    out.dedup();
    out
}

/// Verify latency (ms) against tree size (tokens verified, root included)
/// for up to five context lengths of `cal`: the measured medians (points),
/// BASTION's calibrated roofline (solid) and CaDDTree's convex fit (dashed).
///
/// # Errors
/// [`OutputError::Draw`] naming `path` for drawing or file errors and for a
/// calibration whose convex fit does not rebuild.
pub fn verify_latency(cal: &Calibration, path: &Path) -> Result<(), OutputError> {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.to_path_buf(), what: e.to_string() };
    let mut contexts: Vec<usize> = cal.verify.iter().map(|p| p.context_len).collect();
    contexts.dedup();
    let contexts = spread(&contexts, 5);
    let max_s = cal.verify.iter().map(|p| p.tokens).max().unwrap_or(1);
    let roofline = cal.roofline();
    let f = &cal.fit.caddtree;
    let cost =
        bastion_tree::ConvexCostModel::from_curves(0.0, f.contexts.clone(), f.curves.clone()).map_err(|e| err(&e))?;
    let ms_max = cal
        .verify
        .iter()
        .map(|p| p.seconds)
        .chain(contexts.iter().map(|&c| roofline.at_context(c).estimate(max_s)))
        .fold(0.0f64, f64::max)
        * 1e3
        * 1.08;

    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = format!(
        "Verify latency: {} on {} ({})",
        Path::new(&cal.target.path).file_name().map_or(cal.target.path.clone(), |n| n.to_string_lossy().into()),
        cal.device.name,
        cal.device.backend
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..(max_s as f64 * 1.03), 0f64..ms_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("tokens verified (tree nodes + root)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("verify latency (ms)")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, &c) in contexts.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> =
            cal.verify.iter().filter(|p| p.context_len == c).map(|p| (p.tokens as f64, p.seconds * 1e3)).collect();
        chart
            .draw_series(points.iter().map(|&xy| Circle::new(xy, 4, color.filled())))
            .map_err(|e| err(&e))?
            .label(format!("c = {c}: measured (median)"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        let est = roofline.at_context(c);
        chart
            .draw_series(LineSeries::new((1..=max_s).map(|s| (s as f64, est.estimate(s) * 1e3)), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("c = {c}: BASTION roofline fit"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                (1..=max_s).map(|s| (s as f64, cost.verify_seconds(s - 1, c) * 1e3)),
                6,
                4,
                color.stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label(format!("c = {c}: CaDDTree convex fit"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y), (x + 10, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_keeps_the_ends() {
        assert_eq!(spread(&[1, 2, 3], 5), vec![1, 2, 3]);
        assert_eq!(spread(&[0, 1, 2, 3, 4, 5, 6, 7, 8], 5), vec![0, 2, 4, 6, 8]);
        assert_eq!(spread(&[10, 20, 30, 40, 50, 60], 3), vec![10, 30, 60]);
    }
}
