//! Names the planner's sources: `TENSORTORRENT_PLANNER_SOURCE` is a hash of
//! every file under `src/` (path and bytes, in path order, by the crate's own
//! `Fnv1a64`), so that the crate's `VERSION` changes whenever the search does,
//! and a plan cached by an older search is not replayed as this one's.

use std::fs;
use std::path::{Path, PathBuf};

#[allow(dead_code)] // the build uses a few of the crate's encoders
#[path = "src/hash.rs"]
mod hash;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).expect("the planner's src/ is readable");
    for entry in entries {
        let path = entry.expect("a readable src/ entry").path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=src");
    let mut paths = Vec::new();
    files(&root.join("src"), &mut paths);
    paths.sort();
    let mut h = hash::Fnv1a64::default();
    for path in paths {
        let name = path.strip_prefix(root).expect("under the crate");
        let bytes = fs::read(&path).expect("a readable source file");
        h.str(&name.to_string_lossy());
        h.u64(bytes.len() as u64);
        h.bytes(&bytes);
    }
    println!(
        "cargo:rustc-env=TENSORTORRENT_PLANNER_SOURCE={:016x}",
        h.finish()
    );
}
