//! Function names from ELF symbol tables, for code without DWARF.

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolScope, SymbolSection};

/// One function symbol, covering file virtual addresses `start..end`.
struct Symbol {
    start: u64,
    end: u64,
    name: Box<str>,
    /// False when the symbol had no size and `end` is a guess.
    sized: bool,
    /// Lower is better among aliases at the same address.
    rank: (u8, usize, usize),
}

/// Function symbols of one module, sorted by address, one per address.
#[derive(Default)]
pub(crate) struct SymbolTable {
    symbols: Vec<Symbol>,
}

/// How far back a lookup walks past symbols that end before the address,
/// to find an enclosing one (nested or overlapping symbols are rare).
const MAX_WALK_BACK: usize = 8;

impl SymbolTable {
    /// Adds the function symbols of `.symtab` and `.dynsym` of `file`.
    ///
    /// Call [`SymbolTable::finish`] once every file has been added.
    pub(crate) fn add_file(&mut self, file: &object::File<'_>) {
        // .symtab first: it has the local (static) functions, .dynsym only exports.
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || !symbol.is_definition() {
                continue;
            }
            let SymbolSection::Section(index) = symbol.section() else {
                continue;
            };
            let Ok(name) = symbol.name() else { continue };
            // `memcpy@@GLIBC_2.14`: the version is not part of the function's name.
            let name = match name.find('@') {
                Some(at) if at > 0 => &name[..at],
                _ => name,
            };
            if name.is_empty() {
                continue;
            }
            let start = symbol.address();
            let end = if symbol.size() > 0 {
                start.saturating_add(symbol.size())
            } else {
                // Sizeless (often hand-written assembly): assume it runs to the
                // end of its section, or to the next symbol, whichever is first.
                match file.section_by_index(index) {
                    Ok(section) => section.address().saturating_add(section.size()),
                    Err(_) => continue,
                }
            };
            if end <= start {
                continue;
            }
            let global = matches!(symbol.scope(), SymbolScope::Dynamic | SymbolScope::Linkage);
            let underscores = name.bytes().take_while(|&b| b == b'_').count();
            let rank = (
                u8::from(symbol.size() == 0) * 2 + u8::from(!global),
                underscores,
                name.len(),
            );
            let sized = symbol.size() > 0;
            self.symbols.push(Symbol {
                start,
                end,
                name: name.into(),
                sized,
                rank,
            });
        }
    }

    /// Adds the code symbols of a kernel symbol map (`/proc/kallsyms` or
    /// `System.map`: `ADDRESS TYPE NAME [MODULE]` a line). The map has no
    /// sizes: a function runs to the next symbol.
    pub(crate) fn add_kernel_map(&mut self, text: &str) {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(address), Some(kind), Some(name)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            if !matches!(kind, "t" | "T") {
                continue;
            }
            let Ok(start) = u64::from_str_radix(address, 16) else {
                continue;
            };
            if start == 0 {
                continue;
            }
            self.symbols.push(Symbol {
                start,
                end: u64::MAX,
                name: name.into(),
                sized: false,
                rank: (0, 0, name.len()),
            });
        }
    }

    /// The start of the function containing `address`, with its name.
    pub(crate) fn lookup_start(&self, address: u64) -> Option<(u64, &str)> {
        let after = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(after.checked_sub(1)?)?;
        (address < s.end).then_some((s.start, &*s.name))
    }

    /// Sorts the symbols and keeps the best-named alias at every address
    /// (`malloc` rather than `__libc_malloc`).
    pub(crate) fn finish(&mut self) {
        self.symbols
            .sort_by(|a, b| a.start.cmp(&b.start).then(a.rank.cmp(&b.rank)));
        self.symbols
            .dedup_by(|later, first| later.start == first.start);
        for i in 1..self.symbols.len() {
            let next_start = self.symbols[i].start;
            let previous = &mut self.symbols[i - 1];
            if !previous.sized {
                previous.end = previous.end.min(next_start);
            }
        }
        self.symbols.shrink_to_fit();
    }

    /// Whether no function symbol was found.
    pub(crate) fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The raw (mangled) name of the function containing `address`.
    pub(crate) fn lookup(&self, address: u64) -> Option<&str> {
        self.range_at(address).map(|(_, _, name)| name)
    }

    /// The function containing `address`: its start, end and raw name.
    pub(crate) fn range_at(&self, address: u64) -> Option<(u64, u64, &str)> {
        let after = self.symbols.partition_point(|s| s.start <= address);
        let first = after.saturating_sub(MAX_WALK_BACK);
        let candidates = self.symbols.get(first..after)?;
        // The last symbol starting at or before the address, unless it ends
        // before it; then an earlier one that encloses it.
        candidates
            .iter()
            .rev()
            .find(|s| address < s.end)
            .map(|s| (s.start, s.end, &*s.name))
    }
}
