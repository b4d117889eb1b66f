//! Allocation wrappers recognised from their machine code.
//!
//! A program's own `xmalloc` or `zmalloc_usable` names no site: every
//! stack through it starts the same way. A function is taken for a
//! wrapper when its code is small ([`MAX_WRAPPER_BYTES`]), calls at least
//! one allocation entry point (`malloc`, `calloc`, `operator new`, ...)
//! or another wrapper, and makes no direct call or tail call to anything
//! else but the allocator's other functions (`free`,
//! `malloc_usable_size`), functions that report failure and do
//! not return (`abort`, `__stack_chk_fail`, ...) and leaf functions of its
//! own module (which call nothing). Calls through a pointer that is not
//! an import (an out-of-memory hook) are allowed. Callees in the module
//! itself are judged by the same rule, a few levels deep.
//!
//! Such code alone does not make a wrapper: a program's `leak_here` that
//! only calls `malloc` is the site itself. A function is named a wrapper
//! when it also allocates for several callers: two or more direct calls
//! to it in its module's code, or one from a function that is a wrapper
//! itself (the helper a wrapper calls). A function only ever called
//! through pointers or from other modules is a wrapper by name only
//! (`--alloc-fn`).
//!
//! Only x86_64 code is read (decoded with iced-x86); on another machine
//! no function is recognised from its code, only by name.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget};

use crate::symtab::SymbolTable;

/// Larger functions do work of their own besides allocating.
const MAX_WRAPPER_BYTES: u64 = 1024;
/// How deep callees in the same module are judged.
const MAX_DEPTH: u32 = 3;

/// Functions that allocate: a wrapper calls at least one of them.
const ALLOCATING: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
];

/// Functions a wrapper may call besides allocating ones: the allocator's
/// others, and failure that does not return. Not `memset`: a function
/// that fills what it allocated does work of its own.
const NEUTRAL: &[&str] = &[
    "free",
    "malloc_usable_size",
    "__errno_location",
    "abort",
    "exit",
    "_exit",
    "__stack_chk_fail",
    "__assert_fail",
    "__fortify_fail",
    "_ZSt17__throw_bad_allocv",
    "_ZSt28__throw_bad_array_new_lengthv",
];

/// What a callee is to a wrapper.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Callee {
    Allocating,
    Neutral,
    Other,
    /// Not judged: its callees lie deeper than `MAX_DEPTH`. Read as
    /// `Other`, and never remembered, so that a verdict does not depend
    /// on the depth a function was first met at.
    TooDeep,
}

/// One module's code, read lazily from its file, and the verdicts so far.
pub(crate) struct Code {
    file: File,
    /// Executable sections: (address, end, file offset).
    sections: Vec<(u64, u64, u64)>,
    /// Import stub sections (`.plt`, `.plt.sec`, `.plt.got`): address ranges.
    stubs: Vec<(u64, u64)>,
    /// Imported function by the address of its GOT slot.
    imports: HashMap<u64, Box<str>>,
    /// Function start: whether its code is a wrapper's (Allocating), a
    /// leaf's (Neutral) or neither.
    verdicts: HashMap<u64, Callee>,
    /// Direct calls and jumps to each address in the module's code: how
    /// many, and where the first is. Read when first needed.
    call_sites: Option<HashMap<u64, (u32, u64)>>,
}

impl Code {
    /// The code of ELF file `object`, read from `file`; None for other
    /// machines than x86_64.
    pub(crate) fn new(file: File, object: &object::File<'_>) -> Option<Code> {
        if object.architecture() != object::Architecture::X86_64 {
            return None;
        }
        let mut sections = Vec::new();
        let mut stubs = Vec::new();
        for section in object.sections() {
            if section.kind() != object::SectionKind::Text {
                continue;
            }
            let Some((offset, size)) = section.file_range() else {
                continue;
            };
            let start = section.address();
            sections.push((start, start + size, offset));
            if section.name().is_ok_and(|n| n.starts_with(".plt")) {
                stubs.push((start, start + size));
            }
        }
        let mut imports = HashMap::new();
        if let (Some(relocations), Some(dynsym)) =
            (object.dynamic_relocations(), object.dynamic_symbol_table())
        {
            for (slot, relocation) in relocations {
                let RelocationTarget::Symbol(index) = relocation.target() else {
                    continue;
                };
                let Ok(symbol) = dynsym.symbol_by_index(index) else {
                    continue;
                };
                if symbol.is_definition() {
                    continue;
                }
                if let Ok(name) = symbol.name() {
                    imports.insert(slot, name.into());
                }
            }
        }
        Some(Code {
            file,
            sections,
            stubs,
            imports,
            verdicts: HashMap::new(),
            call_sites: None,
        })
    }

    /// Whether the function containing file address `probe` is an
    /// allocation wrapper; `known` tells wrappers by name.
    pub(crate) fn is_wrapper_at(
        &mut self,
        probe: u64,
        symbols: &SymbolTable,
        known: &dyn Fn(&str) -> bool,
    ) -> bool {
        self.is_wrapper_depth(probe, symbols, known, 0)
    }

    fn is_wrapper_depth(
        &mut self,
        probe: u64,
        symbols: &SymbolTable,
        known: &dyn Fn(&str) -> bool,
        depth: u32,
    ) -> bool {
        let Some((start, end, _)) = symbols.range_at(probe) else {
            return false;
        };
        if self.judge(start, end, symbols, known, 0) != Callee::Allocating {
            return false;
        }
        match self.call_sites().get(&start).copied() {
            Some((n, _)) if n >= 2 => true,
            Some((_, site)) if depth < MAX_DEPTH && !(start..end).contains(&site) => {
                self.is_wrapper_depth(site, symbols, known, depth + 1)
            }
            _ => false,
        }
    }

    fn call_sites(&mut self) -> &HashMap<u64, (u32, u64)> {
        if self.call_sites.is_none() {
            let mut sites: HashMap<u64, (u32, u64)> = HashMap::new();
            for &(lo, hi, _) in &self.sections {
                if self.stubs.iter().any(|&(s, _)| s == lo) {
                    continue;
                }
                let Some(bytes) = self.read(lo, hi) else {
                    continue;
                };
                direct_calls_x86_64(&bytes, lo, |site, target| {
                    let entry = sites.entry(target).or_insert((0, site));
                    entry.0 = entry.0.saturating_add(1);
                });
            }
            self.call_sites = Some(sites);
        }
        self.call_sites.as_ref().expect("just filled")
    }

    fn judge(
        &mut self,
        start: u64,
        end: u64,
        symbols: &SymbolTable,
        known: &dyn Fn(&str) -> bool,
        depth: u32,
    ) -> Callee {
        if let Some(&verdict) = self.verdicts.get(&start) {
            return verdict;
        }
        // Recursion (a function calling itself) reads as not a wrapper.
        self.verdicts.insert(start, Callee::Other);
        let code = (end - start <= MAX_WRAPPER_BYTES)
            .then(|| self.read(start, end))
            .flatten();
        let verdict = code.map_or(Callee::Other, |bytes| {
            self.judge_code(&bytes, start, symbols, known, depth)
        });
        if verdict == Callee::TooDeep {
            self.verdicts.remove(&start);
        } else {
            self.verdicts.insert(start, verdict);
        }
        verdict
    }

    /// What the function at `start`, of code `bytes`, is to a wrapper.
    fn judge_code(
        &mut self,
        bytes: &[u8],
        start: u64,
        symbols: &SymbolTable,
        known: &dyn Fn(&str) -> bool,
        depth: u32,
    ) -> Callee {
        let mut allocates = false;
        let mut calls = false;
        for target in calls_x86_64(bytes, start) {
            calls = true;
            let callee = match target {
                Target::Code(at) => self.callee_at(at, symbols, known, depth),
                Target::Slot(slot) => match self.imports.get(&slot) {
                    Some(name) => by_name(name, known).unwrap_or(Callee::Other),
                    // A pointer of the program's own (a hook).
                    None => Callee::Neutral,
                },
                Target::Unknown => Callee::Neutral,
            };
            match callee {
                Callee::Allocating => allocates = true,
                Callee::Neutral => {}
                Callee::Other | Callee::TooDeep => return callee,
            }
        }
        if allocates {
            Callee::Allocating
        } else if calls {
            Callee::Other
        } else {
            Callee::Neutral
        }
    }

    /// What the code at `at` (a call's target) is to a wrapper.
    fn callee_at(
        &mut self,
        at: u64,
        symbols: &SymbolTable,
        known: &dyn Fn(&str) -> bool,
        depth: u32,
    ) -> Callee {
        if self.stubs.iter().any(|&(lo, hi)| lo <= at && at < hi) {
            let slot = self.read(at, at + 16).and_then(|stub| stub_slot(&stub, at));
            return slot
                .and_then(|slot| self.imports.get(&slot))
                .and_then(|name| by_name(name, known))
                .unwrap_or(Callee::Other);
        }
        let Some((start, end, name)) = symbols.range_at(at) else {
            return Callee::Other;
        };
        if start != at {
            return Callee::Other;
        }
        if let Some(callee) = by_name(name, known) {
            return callee;
        }
        if depth >= MAX_DEPTH {
            return Callee::TooDeep;
        }
        self.judge(start, end, symbols, known, depth + 1)
    }

    /// The bytes of file addresses `start..end`, inside one code section.
    fn read(&self, start: u64, end: u64) -> Option<Vec<u8>> {
        let &(lo, hi, offset) = self
            .sections
            .iter()
            .find(|&&(lo, hi, _)| lo <= start && start < hi)?;
        let end = end.min(hi);
        let mut bytes = vec![0; (end - start) as usize];
        self.file
            .read_exact_at(&mut bytes, offset + (start - lo))
            .ok()?;
        Some(bytes)
    }
}

/// A known callee by its (symbol) name (without a version: the symbol
/// table strips it, and dynamic symbols' names carry none).
fn by_name(name: &str, known: &dyn Fn(&str) -> bool) -> Option<Callee> {
    if ALLOCATING.contains(&name) {
        Some(Callee::Allocating)
    } else if NEUTRAL.contains(&name) {
        Some(Callee::Neutral)
    } else if known(name) {
        Some(Callee::Allocating)
    } else {
        None
    }
}

/// Where a call or tail call of the code goes.
enum Target {
    /// A direct call to this address.
    Code(u64),
    /// An indirect call through the pointer at this address.
    Slot(u64),
    /// An indirect call through a register or computed address.
    Unknown,
}

/// The calls and tail calls out of the function at `start` (its code
/// `bytes`): direct calls anywhere, and jumps that leave its range.
fn calls_x86_64(bytes: &[u8], start: u64) -> Vec<Target> {
    let end = start + bytes.len() as u64;
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut out = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            break;
        }
        let leaves = |at: u64| at < start || at >= end;
        match instruction.flow_control() {
            FlowControl::Call => out.push(Target::Code(instruction.near_branch_target())),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                if instruction.op0_kind() == OpKind::NearBranch64
                    && leaves(instruction.near_branch_target()) =>
            {
                out.push(Target::Code(instruction.near_branch_target()))
            }
            FlowControl::IndirectCall => out.push(indirect(&instruction)),
            // A jump table stays inside; a jump through a GOT slot is a
            // tail call to an import.
            FlowControl::IndirectBranch if instruction.memory_base() == Register::RIP => {
                out.push(indirect(&instruction))
            }
            _ => {}
        }
    }
    out
}

/// Every direct call and unconditional jump in `bytes` (code at `start`),
/// as (where, target).
fn direct_calls_x86_64(bytes: &[u8], start: u64, mut f: impl FnMut(u64, u64)) {
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if matches!(
            instruction.flow_control(),
            FlowControl::Call | FlowControl::UnconditionalBranch
        ) && instruction.op0_kind() == OpKind::NearBranch64
        {
            f(instruction.ip(), instruction.near_branch_target());
        }
    }
}

fn indirect(instruction: &Instruction) -> Target {
    if instruction.op0_kind() == OpKind::Memory && instruction.memory_base() == Register::RIP {
        Target::Slot(instruction.memory_displacement64())
    } else {
        Target::Unknown
    }
}

/// The GOT slot an import stub at `at` jumps through (`endbr64`, then
/// `jmp *slot(%rip)` with or without `bnd`).
fn stub_slot(stub: &[u8], at: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, stub, at, DecoderOptions::NONE);
    for _ in 0..3 {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return None;
        }
        if instruction.flow_control() == FlowControl::IndirectBranch {
            return match indirect(&instruction) {
                Target::Slot(slot) => Some(slot),
                _ => None,
            };
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_tail_calls_are_found_and_local_jumps_are_not() {
        // 0x1000: call 0x2000; je 0x1000 (inside); jmp 0x3000 (tail call);
        // call *0x10(%rip); call *%rax
        let code = [
            0xe8, 0xfb, 0x0f, 0x00, 0x00, // call 0x2000
            0x74, 0xf9, // je 0x1000
            0xe9, 0xf4, 0x1f, 0x00, 0x00, // jmp 0x3000
            0xff, 0x15, 0x10, 0x00, 0x00, 0x00, // call *0x10(%rip)
            0xff, 0xd0, // call *%rax
        ];
        let targets = calls_x86_64(&code, 0x1000);
        let seen: Vec<String> = targets
            .iter()
            .map(|t| match t {
                Target::Code(a) => format!("code {a:#x}"),
                Target::Slot(a) => format!("slot {a:#x}"),
                Target::Unknown => "unknown".to_string(),
            })
            .collect();
        assert_eq!(
            seen,
            ["code 0x2000", "code 0x3000", "slot 0x1022", "unknown"]
        );
    }

    #[test]
    fn an_import_stub_names_its_slot() {
        // endbr64; bnd jmp *0x2fe2(%rip); nop
        let stub = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xe2, 0x2f, 0x00, 0x00, 0x0f, 0x1f, 0x44,
            0x00, 0x00,
        ];
        assert_eq!(stub_slot(&stub, 0x1030), Some(0x1030 + 11 + 0x2fe2));
    }
}
