//! Allocators linked into an executable under names of their own.
//!
//! Rust's tikv-jemallocator (`_rjem_*`), jemalloc built with a prefix
//! (`je_*`, as Redis does), mimalloc (`mi_*`, the Rust mimalloc crate) and
//! tcmalloc (`tc_*`) serve the program's allocations without `malloc`, so
//! trapline's agent never sees them; and since such an executable does not
//! define `malloc`, the agent's own check (the shadowed allocator) stays
//! silent. They are found by their entry points among the executable's
//! symbols, the static symbol table included (release builds of Rust
//! programs keep it unless stripped; a stripped one is not recognized).

use std::path::Path;

use object::{Object, ObjectSymbol};

/// An allocator found in an executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivateAllocator {
    /// Which allocator: "jemalloc", "mimalloc" or "tcmalloc".
    pub allocator: &'static str,
    /// The entry point that gave it away (`_rjem_malloc`, `je_malloc`, ...).
    pub symbol: String,
}

const ENTRY_POINTS: [(&str, &str); 6] = [
    ("_rjem_mallocx", "jemalloc"),
    ("_rjem_malloc", "jemalloc"),
    ("je_mallocx", "jemalloc"),
    ("je_malloc", "jemalloc"),
    ("mi_malloc", "mimalloc"),
    ("tc_malloc", "tcmalloc"),
];

/// The private allocator defined in the ELF file `data`, if any.
pub fn private_allocator<'data, R: object::ReadRef<'data>>(data: R) -> Option<PrivateAllocator> {
    defined_in(&object::File::parse(data).ok()?)
}

/// The private allocator of the executable at `path`, when the file is
/// still the build a trace recorded (`build_id`; empty: not checked).
/// None when the file is gone, unreadable or another build: then nothing
/// can be told.
pub fn private_allocator_of(path: &Path, build_id: &[u8]) -> Option<PrivateAllocator> {
    let file = crate::BlockFile::new(std::fs::File::open(path).ok()?).ok()?;
    // Read lazily: only the headers and symbol tables are needed.
    let data = object::read::ReadCache::new(file);
    let object = object::File::parse(&data).ok()?;
    if !build_id.is_empty() && object.build_id().ok()?? != build_id {
        return None;
    }
    defined_in(&object)
}

fn defined_in<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
) -> Option<PrivateAllocator> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|sym| sym.is_definition())
        .find_map(|sym| {
            let name = sym.name().ok()?;
            ENTRY_POINTS
                .iter()
                .find(|(entry, _)| *entry == name)
                .map(|(entry, allocator)| PrivateAllocator {
                    allocator,
                    symbol: entry.to_string(),
                })
        })
}
