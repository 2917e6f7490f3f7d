//! Names the planner's sources: `TENSORTORRENT_PLANNER_SOURCE` is an FNV-1a
//! 64 hash of every file under `src/` (path and bytes, in path order), so
//! that [`VERSION`](crate::VERSION) changes whenever the search does, and a
//! plan cached by an older search is not replayed as this one's.

use std::fs;
use std::path::{Path, PathBuf};

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
    let src = root.join("src");
    println!("cargo:rerun-if-changed=src");
    let mut paths = Vec::new();
    files(&src, &mut paths);
    paths.sort();
    let mut state: u64 = 0xcbf2_9ce4_8422_2325;
    for path in paths {
        let name = path.strip_prefix(root).expect("under the crate");
        let bytes = fs::read(&path).expect("a readable source file");
        let name = name.to_string_lossy();
        for chunk in [name.as_bytes(), &[0u8], &bytes, &[0u8]] {
            for &b in chunk {
                state ^= u64::from(b);
                state = state.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    println!("cargo:rustc-env=TENSORTORRENT_PLANNER_SOURCE={state:016x}");
}
