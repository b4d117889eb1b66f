//! The import slots of the loaded modules (their GOT entries), for
//! attaching to a running process: where preloading made the dynamic
//! loader bind a module's calls to the agent, attaching rewrites the slots
//! the loader already filled.
//!
//! A module's `PT_DYNAMIC` names its relocation tables; each
//! `R_X86_64_JUMP_SLOT` (a call through the PLT) or `R_X86_64_GLOB_DAT` (a
//! call without PLT, or a function's address taken) relocation names a
//! symbol and the slot that holds its address; so does an `R_X86_64_64`
//! that puts a function's address in data. A slot is one aligned word,
//! so a write is seen whole by a thread calling through it: the old
//! function or the new one, never half of each. Slots inside
//! `PT_GNU_RELRO` were made read-only after relocation; they are made
//! writable for the write and read-only again.

use core::ffi::{c_char, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const R_X86_64_64: u32 = 1;
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;

/// An entry of a dynamic section (the libc crate declares none).
#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

/// One loaded module, as `dl_iterate_phdr` lists it.
#[derive(Clone, Copy)]
pub struct Module {
    /// Load bias: the difference between addresses in memory and in the file.
    pub base: usize,
    pub phdrs: *const libc::Elf64_Phdr,
    pub phnum: usize,
    pub name: *const c_char,
    /// The calling thread's TLS block of the module (null: none, or not
    /// allocated for this thread yet).
    pub tls_data: *const libc::c_void,
}

/// An import slot: where it is and the symbol it holds.
pub struct Slot<'a> {
    pub addr: usize,
    pub name: &'a CStr,
    /// Inside the module's RELRO region (read-only after relocation).
    pub relro: bool,
}

/// Every loaded module, in the loader's order (the executable first).
pub fn modules() -> Vec<Module> {
    extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info; `data` is the Vec
        // passed below.
        unsafe {
            let out = &mut *(data as *mut Vec<Module>);
            let i = &*info;
            out.push(Module {
                base: i.dlpi_addr as usize,
                phdrs: i.dlpi_phdr,
                phnum: usize::from(i.dlpi_phnum),
                name: i.dlpi_name,
                tls_data: i.dlpi_tls_data,
            });
        }
        0
    }
    let mut out: Vec<Module> = Vec::new();
    // SAFETY: the callback only pushes onto `out`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(each),
            &mut out as *mut Vec<Module> as *mut libc::c_void,
        )
    };
    out
}

/// What `Module::dynamic` reads of a dynamic section (0: absent).
#[derive(Default)]
struct Dynamic {
    strtab: usize,
    symtab: usize,
    rela: usize,
    relasz: usize,
    jmprel: usize,
    pltrelsz: usize,
    hash: usize,
    gnu_hash: usize,
}

impl Module {
    /// The module's path ("" for the executable and the vDSO's own name).
    pub fn path(&self) -> &CStr {
        if self.name.is_null() {
            return c"";
        }
        // SAFETY: the loader's NUL-terminated name, alive while the module is.
        unsafe { CStr::from_ptr(self.name) }
    }

    /// The addresses its loadable segments span.
    pub fn extent(&self) -> core::ops::Range<usize> {
        let loads = self.phdrs().iter().filter(|p| p.p_type == libc::PT_LOAD);
        let start = loads.clone().map(|p| p.p_vaddr as usize).min().unwrap_or(0);
        let end = loads
            .map(|p| (p.p_vaddr + p.p_memsz) as usize)
            .max()
            .unwrap_or(0);
        self.base + start..self.base + end
    }

    /// The calling thread's TLS block of the module, `[start, end)`.
    pub fn own_tls(&self) -> Option<(usize, usize)> {
        let tls = self.phdrs().iter().find(|p| p.p_type == libc::PT_TLS)?;
        let start = self.tls_data as usize;
        (start != 0).then(|| (start, start + tls.p_memsz as usize))
    }

    /// The entries of the module's dynamic section read here, tables as
    /// addresses in memory; none without a dynamic section, a string table
    /// or a symbol table.
    fn dynamic(&self) -> Option<Dynamic> {
        let section = self.phdrs().iter().find(|p| p.p_type == PT_DYNAMIC)?;
        let mut dy = Dynamic::default();
        let mut d = (self.base + section.p_vaddr as usize) as *const Dyn;
        // SAFETY: the module's dynamic section, ended by DT_NULL.
        unsafe {
            while (*d).tag != DT_NULL {
                let v = (*d).value as usize;
                match (*d).tag {
                    DT_STRTAB => dy.strtab = v,
                    DT_SYMTAB => dy.symtab = v,
                    DT_RELA => dy.rela = v,
                    DT_RELASZ => dy.relasz = v,
                    DT_JMPREL => dy.jmprel = v,
                    DT_PLTRELSZ => dy.pltrelsz = v,
                    DT_HASH => dy.hash = v,
                    DT_GNU_HASH => dy.gnu_hash = v,
                    _ => {}
                }
                d = d.add(1);
            }
        }
        // glibc's loader rewrites these to addresses in memory; the vDSO's
        // (and another loader's) stay offsets from the base.
        for v in [
            &mut dy.strtab,
            &mut dy.symtab,
            &mut dy.rela,
            &mut dy.jmprel,
            &mut dy.hash,
            &mut dy.gnu_hash,
        ] {
            if *v != 0 && *v < self.base {
                *v += self.base;
            }
        }
        (dy.strtab != 0 && dy.symtab != 0).then_some(dy)
    }

    fn phdrs(&self) -> &[libc::Elf64_Phdr] {
        if self.phdrs.is_null() {
            return &[];
        }
        // SAFETY: the loader's program headers of a loaded module.
        unsafe { core::slice::from_raw_parts(self.phdrs, self.phnum) }
    }

    /// Calls `f` on every function import slot of the module.
    pub fn for_each_slot(&self, mut f: impl FnMut(Slot)) {
        let Some(dynamic) = self.dynamic() else {
            return;
        };
        let relro = self
            .phdrs()
            .iter()
            .find(|p| p.p_type == PT_GNU_RELRO)
            .map(|p| {
                let start = self.base + p.p_vaddr as usize;
                start..start + p.p_memsz as usize
            });
        let (strtab, symtab) = (dynamic.strtab, dynamic.symtab);
        for (table, size) in [
            (dynamic.rela, dynamic.relasz),
            (dynamic.jmprel, dynamic.pltrelsz),
        ] {
            if table == 0 {
                continue;
            }
            let count = size / core::mem::size_of::<libc::Elf64_Rela>();
            // SAFETY: the module's relocation table of `count` entries.
            let relocs =
                unsafe { core::slice::from_raw_parts(table as *const libc::Elf64_Rela, count) };
            for r in relocs {
                let kind = (r.r_info & 0xffff_ffff) as u32;
                // A function's address in data (a table of function
                // pointers, `void (*f)(void *) = free;`): one word holding
                // the symbol itself, no addend.
                let data = kind == R_X86_64_64 && r.r_addend == 0 && r.r_offset % 8 == 0;
                if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT && !data {
                    continue;
                }
                let index = (r.r_info >> 32) as usize;
                // SAFETY: an index the module's own relocation gives into its
                // symbol table, whose name is in its string table.
                let name = unsafe {
                    let sym = &*(symtab as *const libc::Elf64_Sym).add(index);
                    CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char)
                };
                let addr = self.base + r.r_offset as usize;
                f(Slot {
                    addr,
                    name,
                    relro: relro.as_ref().is_some_and(|r| r.contains(&addr)),
                });
            }
        }
    }

    /// The address of the function or object `name` the module defines (its
    /// dynamic symbol table, through DT_GNU_HASH or DT_HASH), or 0. Unlike
    /// dlsym it never allocates: a failed dlsym allocates its message
    /// through the program's malloc, which at exit may be an allocator of
    /// the program's own or a heap the program corrupted.
    pub fn defined(&self, name: &CStr) -> usize {
        let Some(Dynamic {
            strtab,
            symtab,
            hash,
            gnu_hash,
            ..
        }) = self.dynamic()
        else {
            return 0;
        };
        let wanted = name.to_bytes();
        let matches = |index: usize| -> usize {
            // SAFETY: an index the module's hash table gives into its symbol
            // table, whose names are in its string table.
            let sym = unsafe { &*(symtab as *const libc::Elf64_Sym).add(index) };
            let kind = sym.st_info & 0xf;
            // Defined (a section index), an object or a function.
            let defined = sym.st_shndx != 0 && (kind == 1 || kind == 2);
            // SAFETY: as above.
            let named = unsafe {
                CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char).to_bytes()
            };
            if defined && named == wanted {
                self.base + sym.st_value as usize
            } else {
                0
            }
        };
        if gnu_hash != 0 {
            let h = wanted.iter().fold(5381u32, |h, &c| {
                h.wrapping_mul(33).wrapping_add(u32::from(c))
            });
            let table = gnu_hash as *const u32;
            // SAFETY: the module's GNU hash table: nbuckets, symoffset,
            // bloom size and shift, the bloom words, the buckets, the chains.
            unsafe {
                let (nbuckets, symoffset, bloom_size) = (
                    *table as usize,
                    *table.add(1) as usize,
                    *table.add(2) as usize,
                );
                if nbuckets == 0 {
                    return 0;
                }
                let buckets = table.add(4 + bloom_size * 2);
                let chains = buckets.add(nbuckets);
                let mut i = *buckets.add(h as usize % nbuckets) as usize;
                if i < symoffset {
                    return 0;
                }
                loop {
                    let ch = *chains.add(i - symoffset);
                    if ch | 1 == h | 1 {
                        let found = matches(i);
                        if found != 0 {
                            return found;
                        }
                    }
                    if ch & 1 != 0 {
                        return 0;
                    }
                    i += 1;
                }
            }
        }
        if hash != 0 {
            // SAFETY: the module's SysV hash table: nbucket, nchain, then
            // the chains cover every symbol.
            let nchain = unsafe { *(hash as *const u32).add(1) } as usize;
            return (1..nchain).map(matches).find(|&a| a != 0).unwrap_or(0);
        }
        0
    }
}

/// The first definition of `name` in the loaded modules, in the loader's
/// order (as RTLD_DEFAULT finds it), or 0; never allocates from the program.
pub fn defined_anywhere(name: &CStr) -> usize {
    modules()
        .iter()
        .map(|m| m.defined(name))
        .find(|&a| a != 0)
        .unwrap_or(0)
}

/// The value in a slot.
pub fn read(slot: usize) -> usize {
    // SAFETY: an aligned import slot of a loaded module (for_each_slot).
    unsafe { (*(slot as *const AtomicUsize)).load(Ordering::Acquire) }
}

/// Writes `value` into a slot, making a read-only page writable for the
/// write; false when the kernel refuses.
pub fn write(slot: usize, relro: bool, value: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let len = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let page = slot & !(len - 1);
    // SAFETY: the page of a loaded module's import slot, made writable and
    // read-only again around one aligned store into the slot.
    unsafe {
        if relro
            && libc::mprotect(
                page as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            ) != 0
        {
            return false;
        }
        (*(slot as *const AtomicUsize)).store(value, Ordering::Release);
        if relro {
            libc::mprotect(page as *mut libc::c_void, len, libc::PROT_READ);
        }
    }
    true
}
