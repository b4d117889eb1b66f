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
    if let Some(found) = defined_in_elf64(data) {
        return found;
    }
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
    if let Some(found) = defined_in_elf64(&data) {
        return found;
    }
    defined_in(&object)
}

/// `defined_in` for a 64-bit ELF file (None: not one), with each symbol
/// table's strings read in one piece: looking names up one by one through
/// a lazily read file took 0.3 s for node's 110,000 symbols before every
/// `trapline run` (8 ms this way).
fn defined_in_elf64<'data, R: object::ReadRef<'data>>(data: R) -> Option<Option<PrivateAllocator>> {
    use object::read::elf::{ElfFile64, SectionHeader, Sym};
    let elf = ElfFile64::<object::Endianness, R>::parse(data).ok()?;
    let endian = elf.endian();
    for table in [elf.elf_symbol_table(), elf.elf_dynamic_symbol_table()] {
        if table.is_empty() {
            continue;
        }
        let header = elf
            .elf_section_table()
            .section(table.string_section())
            .ok()?;
        let (start, size) = header.file_range(endian)?;
        let strings = data.read_bytes_at(start, size).ok()?;
        for sym in table.symbols() {
            if sym.st_shndx(endian) == object::elf::SHN_UNDEF {
                continue;
            }
            let Some(rest) = strings.get(sym.st_name(endian) as usize..) else {
                continue;
            };
            let name = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
            if let Some((entry, allocator)) =
                ENTRY_POINTS.iter().find(|(e, _)| e.as_bytes() == name)
            {
                return Some(Some(PrivateAllocator {
                    allocator,
                    symbol: entry.to_string(),
                }));
            }
        }
    }
    Some(None)
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
