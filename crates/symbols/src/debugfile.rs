//! Finding separate debug files: by build id, `.gnu_debuglink` and
//! `.gnu_debugaltlink`, the way GDB looks for them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::Object;

/// A file read into memory.
///
/// Whole files are read with `std::fs::read` rather than mapped: mapping is
/// `unsafe` (the file may change under us), and reading costs little next to
/// parsing the DWARF.
pub(crate) struct LoadedFile {
    pub(crate) path: PathBuf,
    pub(crate) data: Arc<[u8]>,
}

/// Reads a whole file.
pub(crate) fn read_file(path: &Path) -> std::io::Result<LoadedFile> {
    let data = std::fs::read(path)?;
    Ok(LoadedFile {
        path: path.to_path_buf(),
        data: data.into(),
    })
}

/// `dir/.build-id/ab/cdef….debug` for every debug directory.
fn build_id_paths(build_id: &[u8], debug_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let Some((first, rest)) = build_id.split_first() else {
        return Vec::new();
    };
    if rest.is_empty() {
        return Vec::new();
    }
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    debug_dirs
        .iter()
        .map(|dir| {
            dir.join(".build-id")
                .join(format!("{first:02x}"))
                .join(format!("{rest}.debug"))
        })
        .collect()
}

/// The build id of an ELF file in memory, if it parses and has one.
fn build_id_of(data: &[u8]) -> Option<Vec<u8>> {
    let file = object::File::parse(data).ok()?;
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The first candidate that can be read and whose build id is `build_id`.
fn first_with_build_id(candidates: &[PathBuf], build_id: &[u8]) -> Option<LoadedFile> {
    candidates.iter().find_map(|path| {
        let file = read_file(path).ok()?;
        (build_id_of(&file.data).as_deref() == Some(build_id)).then_some(file)
    })
}

/// Finds the separate debug file of `module`, whose own ELF is `object`.
///
/// The build id wins over `.gnu_debuglink`: it identifies the exact build,
/// while the link only names a file (its CRC is checked all the same).
pub(crate) fn find_debug_file(
    module: &Path,
    object: &object::File<'_>,
    debug_dirs: &[PathBuf],
) -> Option<LoadedFile> {
    if let Some(build_id) = object.build_id().ok().flatten() {
        if let Some(file) = first_with_build_id(&build_id_paths(build_id, debug_dirs), build_id) {
            return Some(file);
        }
    }
    let (name, crc) = object.gnu_debuglink().ok().flatten()?;
    let name = Path::new(OsStr::from_bytes(name));
    // A link is a bare file name; anything else could point outside the
    // debug directories.
    if name.components().count() != 1 {
        return None;
    }
    let dir = module.parent().unwrap_or(Path::new("/"));
    let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
    for debug_dir in debug_dirs {
        candidates.push(
            debug_dir
                .join(dir.strip_prefix("/").unwrap_or(dir))
                .join(name),
        );
    }
    candidates
        .into_iter()
        .filter(|path| path != module)
        .find_map(|path| {
            let file = read_file(&path).ok()?;
            (crc32fast::hash(&file.data) == crc).then_some(file)
        })
}

/// Finds the supplementary (dwz) file named by `.gnu_debugaltlink` of `debug`.
pub(crate) fn find_sup_file(
    debug: &LoadedFile,
    object: &object::File<'_>,
    debug_dirs: &[PathBuf],
) -> Option<LoadedFile> {
    let (name, build_id) = object.gnu_debugaltlink().ok().flatten()?;
    let name = Path::new(OsStr::from_bytes(name));
    let mut candidates = Vec::new();
    if name.is_absolute() {
        candidates.push(name.to_path_buf());
    } else if let Some(dir) = debug.path.parent() {
        candidates.push(dir.join(name));
    }
    candidates.extend(build_id_paths(build_id, debug_dirs));
    first_with_build_id(&candidates, build_id)
}
