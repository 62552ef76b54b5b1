//! Stamps the binary with the commit it is built from (`BASTION_BUILD_COMMIT`:
//! the short hash, `+changes` when tracked files differ from it, `unknown`
//! outside this workspace's git checkout), so that a sweep's records say which
//! code made them even when the binary is older than the checkout it runs in.

use std::path::{Path, PathBuf};

// The one definition of a checkout's commit, shared with `bastion_eval::provenance`.
#[path = "../eval/src/git_commit.rs"]
#[allow(dead_code)]
mod git_commit;

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| git_commit::git(&workspace, args);
    // Only this workspace's own checkout: a copy of the sources inside another
    // repository (a registry's folder kept in git) is not stamped with that one's commit.
    let top = git(&["rev-parse", "--show-toplevel"]).map(PathBuf::from);
    let ours = top.zip(workspace.canonicalize().ok()).is_some_and(|(t, w)| t.canonicalize().ok() == Some(w));
    let stamp = if ours { git_commit::commit(&workspace) } else { "unknown".to_string() };
    println!("cargo:rustc-env=BASTION_BUILD_COMMIT={stamp}");
    // Run again when the commit moves (HEAD and the index in the worktree's git
    // folder, the branch and packed refs in the common one) or a source of the
    // workspace changes (Cargo scans a folder whole). A path that does not exist
    // would rerun the script on every build, so only existing ones are named.
    let mut watch: Vec<PathBuf> = Vec::new();
    if ours {
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
            watch.extend(["HEAD", "index"].map(|f| dir.join(f)));
        }
        if let Some(common) = git(&["rev-parse", "--git-common-dir"]).map(|d| workspace.join(d)) {
            watch.push(common.join("packed-refs"));
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch.push(common.join(branch));
            }
        }
    }
    watch.extend(["crates", "Cargo.toml", "Cargo.lock"].map(|f| workspace.join(f)));
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
