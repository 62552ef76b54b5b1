//! The git commit of a checkout, shared by the binary's build script (the
//! commit it is built from) and [`crate::provenance`] (the checkout a run
//! starts in), so both name a commit the same way.

use std::path::Path;
use std::process::Command;

/// The trimmed output of `git ARGS` run in `dir`, or `None` when git or the
/// checkout is not there or the command fails.
pub fn git(dir: &Path, args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The commit checked out in `dir` (short hash; `+changes` when tracked files
/// differ from it), or `unknown` when git or the checkout is not there.
pub fn commit(dir: &Path) -> String {
    match git(dir, &["rev-parse", "--short=10", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let changed = git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if changed {
                format!("{hash}+changes")
            } else {
                hash
            }
        }
        _ => "unknown".to_string(),
    }
}

/// A commit as [`commit`] writes it, without its `+changes`: the code's
/// commit, for comparing a binary's with a checkout's.
pub fn base(commit: &str) -> &str {
    commit.strip_suffix("+changes").unwrap_or(commit)
}
