//! Stamps the binary with the commit it is built from (`BASTION_BUILD_COMMIT`:
//! the short hash, `+changes` when tracked files differ from it, `unknown`
//! outside a git checkout), so that a sweep's records say which code made
//! them even when the binary is older than the checkout it runs in.

use std::path::Path;
use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let stamp = match git(&["rev-parse", "--short=10", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let changed = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if changed {
                format!("{hash}+changes")
            } else {
                hash
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=BASTION_BUILD_COMMIT={stamp}");
    // Run again when the commit moves (HEAD, the branch it names, packed refs, the
    // index) or any source of the workspace changes (Cargo scans a folder whole).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        for f in ["HEAD", "index", "packed-refs"] {
            println!("cargo:rerun-if-changed={}", dir.join(f).display());
        }
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(branch).display());
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for tracked in ["crates", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(tracked).display());
    }
}
