//! The draft-tree crate builds without Burn: the kernels it takes (top-k and
//! log-sum-exp of logit rows, the ancestor mask, the device roof) come from
//! `bastion-kernels` without its default `burn` feature. A `burn` in its
//! dependency tree would mean a kernels module lost its feature gate, or a
//! dependency declaration its `default-features = false`.

use std::process::Command;

#[test]
fn the_tree_crate_links_no_burn_and_no_cubecl() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "bastion-tree", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    assert!(tree.lines().any(|l| l.starts_with("bastion-kernels ")), "bastion-kernels missing:\n{tree}");
    let heavy: Vec<&str> =
        tree.lines().filter(|l| l.starts_with("burn") || l.starts_with("cubecl") || l.starts_with("polars")).collect();
    assert!(heavy.is_empty(), "bastion-tree pulls in {heavy:?}");
}
