//! What the replay traps, where: the guest addresses of the program's
//! allocator (from the symbols of the files the guest's loader mapped, at
//! the addresses it printed) and of the guest kernel's (from the kernel's
//! symbol table, dumped in the recording), written as the plugin's plan.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use trapline_outside::traps::{Trap, TRAPPED};
use trapline_trace::event::segment_flags;
use trapline_trace::{AllocFn, LockMode, LockOp, Segment};

use crate::VmError;

/// One file the guest's loader mapped for the program.
pub struct Loaded {
    pub path: PathBuf,
    pub data: Vec<u8>,
    pub bias: u64,
    pub segments: Vec<Segment>,
    pub build_id: Vec<u8>,
}

impl Loaded {
    fn new(path: &Path, mapped_at: Option<u64>) -> Result<Loaded, VmError> {
        let data = std::fs::read(path).map_err(|e| {
            VmError::damaged(format!(
                "{}: {e} (the replay reads the files the guest loaded)",
                path.display()
            ))
        })?;
        let file = object::File::parse(&*data)
            .map_err(|e| VmError::damaged(format!("{}: {e}", path.display())))?;
        let lowest = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
        let bias = match mapped_at {
            Some(at) => at.wrapping_sub(lowest),
            None if file.kind() == object::ObjectKind::Dynamic => {
                main_program_base(&file).wrapping_sub(lowest)
            }
            None => 0,
        };
        let segments = file
            .segments()
            .map(|s| {
                // PF_X, PF_W, PF_R are the trace's EXEC, WRITE, READ bits.
                let bits = match s.flags() {
                    object::SegmentFlags::Elf { p_flags, .. } => (p_flags.0 & 7) as u8,
                    _ => 0,
                };
                Segment {
                    start: s.address().wrapping_add(bias),
                    end: (s.address() + s.size()).wrapping_add(bias),
                    flags: bits,
                }
            })
            .collect();
        let build_id = file
            .build_id()
            .ok()
            .flatten()
            .map(|b| b.to_vec())
            .unwrap_or_default();
        drop(file);
        Ok(Loaded {
            path: path.to_path_buf(),
            data,
            bias,
            segments,
            build_id,
        })
    }

    /// Executable ranges, at guest addresses.
    pub fn code(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments
            .iter()
            .filter(|s| s.flags & segment_flags::EXEC != 0)
            .map(|s| (s.start, s.end))
    }

    pub fn span(&self) -> (u64, u64) {
        let start = self.segments.iter().map(|s| s.start).min().unwrap_or(0);
        let end = self.segments.iter().map(|s| s.end).max().unwrap_or(0);
        (start, end)
    }
}

/// Where Linux maps a position-independent program with an interpreter
/// when address randomization is off: `ELF_ET_DYN_BASE`, two thirds of
/// the 47-bit user space, aligned down to the largest segment alignment.
fn main_program_base(file: &object::File) -> u64 {
    const ELF_ET_DYN_BASE: u64 = 0x7fff_ffff_f000 / 3 * 2;
    let align = file
        .segments()
        .filter_map(|s| match s.flags() {
            object::SegmentFlags::Elf { .. } => Some(s.align()),
            _ => None,
        })
        .filter(|a| a.is_power_of_two())
        .max()
        .unwrap_or(0x1000)
        .max(0x1000);
    ELF_ET_DYN_BASE & !(align - 1) & !0xfff
}

/// The program and its libraries as the guest mapped them.
pub struct Layout {
    /// The program first, then the libraries in the loader's order.
    pub modules: Vec<Loaded>,
    /// Where the dynamic loader is: the agent never sees the allocations it
    /// makes (through the C library's functions, but not through their
    /// import slots), so neither does a replay.
    pub loader: Option<(u64, u64)>,
}

impl Layout {
    pub fn new(program: &Path, libraries: &[(PathBuf, u64)]) -> Result<Layout, VmError> {
        let mut modules = vec![Loaded::new(program, None)?];
        for (path, at) in libraries {
            modules.push(Loaded::new(path, Some(*at))?);
        }
        let interpreter = crate::guest::interpreter(&modules[0].data);
        let loader = modules
            .iter()
            .find(|m| interpreter.as_deref() == Some(&*m.path.to_string_lossy()))
            .map(Loaded::span);
        Ok(Layout { modules, loader })
    }
}

/// What a trapped address means.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Meaning {
    /// The program's entry point: the first user instruction of the traced
    /// process, which tells the plugin and the conversion its address space.
    Start,
    /// `exit_mmap`: the traced process's address space is torn down (at its
    /// exit, or an exec), and its page tables may serve another process.
    End,
    User(Trap),
    Kernel(KernelCall),
    /// A pthread function of the program's.
    Sync(SyncCall),
}

/// Which pthread lock type a call is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LockClass {
    /// A mutex: its type is glibc's kind word, peeked at the call.
    Mutex,
    RwLock,
    Spin,
}

/// A pthread function the replay traps: the calls the agent wraps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SyncCall {
    /// lock, rdlock/wrlock, trylock, timedlock and clocklock.
    Acquire(LockClass, LockMode, LockOp),
    Release(LockClass),
    Init(LockClass),
    Destroy(LockClass),
    /// `pthread_cond_wait` and its timed forms: the mutex (the second
    /// argument) is released, then held again at the return.
    CondWait,
    /// `pthread_create`: the new thread's `pthread_t` is read through the
    /// first argument at the return.
    Create,
    Join,
    Detach,
    Exit,
    /// glibc's `__call_tls_dtors`, which a thread's start routine's
    /// caller runs when the thread ends (and `exit` in the thread that
    /// calls it).
    ThreadEnds,
}

/// Where glibc keeps a mutex's kind word (`__kind`), and so the peek at
/// each mutex call and the read after `pthread_mutex_init`.
pub const MUTEX_KIND_OFFSET: u64 = 16;

/// The pthread functions trapped, by name.
const SYNC_TRAPPED: &[(&str, SyncCall)] = {
    use LockClass::*;
    use LockMode::*;
    use LockOp::{Blocking, Timed, Try};
    use SyncCall::*;
    &[
        ("pthread_mutex_lock", Acquire(Mutex, Exclusive, Blocking)),
        ("pthread_mutex_timedlock", Acquire(Mutex, Exclusive, Timed)),
        ("pthread_mutex_clocklock", Acquire(Mutex, Exclusive, Timed)),
        ("pthread_mutex_trylock", Acquire(Mutex, Exclusive, Try)),
        ("pthread_mutex_unlock", Release(Mutex)),
        ("pthread_mutex_init", Init(Mutex)),
        ("pthread_mutex_destroy", Destroy(Mutex)),
        ("pthread_rwlock_rdlock", Acquire(RwLock, Shared, Blocking)),
        (
            "pthread_rwlock_wrlock",
            Acquire(RwLock, Exclusive, Blocking),
        ),
        ("pthread_rwlock_timedrdlock", Acquire(RwLock, Shared, Timed)),
        (
            "pthread_rwlock_timedwrlock",
            Acquire(RwLock, Exclusive, Timed),
        ),
        ("pthread_rwlock_clockrdlock", Acquire(RwLock, Shared, Timed)),
        (
            "pthread_rwlock_clockwrlock",
            Acquire(RwLock, Exclusive, Timed),
        ),
        ("pthread_rwlock_tryrdlock", Acquire(RwLock, Shared, Try)),
        ("pthread_rwlock_trywrlock", Acquire(RwLock, Exclusive, Try)),
        ("pthread_rwlock_unlock", Release(RwLock)),
        ("pthread_rwlock_init", Init(RwLock)),
        ("pthread_rwlock_destroy", Destroy(RwLock)),
        ("pthread_spin_lock", Acquire(Spin, Exclusive, Blocking)),
        ("pthread_spin_trylock", Acquire(Spin, Exclusive, Try)),
        // pthread_spin_init and _destroy are not recorded (nor by the
        // agent): the first is pthread_spin_unlock's code (`Release`).
        ("pthread_spin_unlock", Release(Spin)),
        ("pthread_cond_wait", CondWait),
        ("pthread_cond_timedwait", CondWait),
        ("pthread_cond_clockwait", CondWait),
        ("pthread_create", Create),
        ("pthread_join", Join),
        ("pthread_detach", Detach),
        ("pthread_exit", Exit),
        ("__call_tls_dtors", ThreadEnds),
    ]
};

/// A kernel allocator function: which argument holds the size or the
/// block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelCall {
    /// Size in argument N (0-based); `Peeked`: the size is the cache's
    /// object size, read through the first argument.
    Allocate(AllocFn, SizeFrom),
    /// `krealloc(block, size)`.
    Reallocate,
    /// The block in argument N.
    Release(AllocFn, usize),
    /// `kmem_cache_free_bulk(cache, count, blocks)`: batched `kfree_rcu`
    /// frees this way.
    ReleaseBulk,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeFrom {
    Arg(usize),
    Peeked,
}

/// Offset of `object_size` in SLUB's `struct kmem_cache` (Linux 6.x:
/// after the per-CPU pointer, the flags, `min_partial` and `size`).
const KMEM_CACHE_OBJECT_SIZE: u64 = 28;

/// The kernel functions trapped, by symbol (Linux 6.10 added `_noprof`
/// to the allocating ones; both spellings are looked up).
const KERNEL_TRAPPED: &[(&str, KernelCall)] = {
    use AllocFn::*;
    use KernelCall::*;
    use SizeFrom::*;
    &[
        ("__kmalloc", Allocate(Kmalloc, Arg(0))),
        ("__kmalloc_node", Allocate(Kmalloc, Arg(0))),
        ("__kmalloc_node_track_caller", Allocate(Kmalloc, Arg(0))),
        ("__kmalloc_cache", Allocate(Kmalloc, Arg(2))),
        ("__kmalloc_cache_node", Allocate(Kmalloc, Arg(3))),
        ("kmalloc_trace", Allocate(Kmalloc, Arg(2))),
        ("kmalloc_large", Allocate(Kmalloc, Arg(0))),
        ("kmalloc_large_node", Allocate(Kmalloc, Arg(0))),
        ("kmem_cache_alloc", Allocate(KmemCacheAlloc, Peeked)),
        ("kmem_cache_alloc_node", Allocate(KmemCacheAlloc, Peeked)),
        ("kmem_cache_alloc_lru", Allocate(KmemCacheAlloc, Peeked)),
        ("__kvmalloc_node", Allocate(Kvmalloc, Arg(0))),
        ("kvmalloc_node", Allocate(Kvmalloc, Arg(0))),
        ("krealloc", Reallocate),
        ("vmalloc", Allocate(Vmalloc, Arg(0))),
        ("vzalloc", Allocate(Vmalloc, Arg(0))),
        ("__vmalloc", Allocate(Vmalloc, Arg(0))),
        ("vmalloc_node", Allocate(Vmalloc, Arg(0))),
        ("vzalloc_node", Allocate(Vmalloc, Arg(0))),
        ("__vmalloc_node", Allocate(Vmalloc, Arg(0))),
        ("__vmalloc_node_range", Allocate(Vmalloc, Arg(0))),
        ("vmalloc_user", Allocate(Vmalloc, Arg(0))),
        ("kfree", Release(Kfree, 0)),
        ("kfree_sensitive", Release(Kfree, 0)),
        ("kvfree", Release(Kvfree, 0)),
        ("kvfree_sensitive", Release(Kvfree, 0)),
        ("kmem_cache_free", Release(KmemCacheFree, 1)),
        ("vfree", Release(Vfree, 0)),
        ("kmem_cache_free_bulk", ReleaseBulk),
    ]
};

/// Where the kernel's code is: its text, and the module area (Linux
/// x86-64 without KASLR: `MODULES_VADDR` to `MODULES_END`).
fn kernel_code(symbols: &str) -> Vec<(u64, u64)> {
    let find = |name: &str| {
        symbols.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            let (a, _, n) = (w.next()?, w.next()?, w.next()?);
            (n == name)
                .then(|| u64::from_str_radix(a, 16).ok())
                .flatten()
        })
    };
    let mut code = Vec::new();
    if let (Some(a), Some(b)) = (find("_stext"), find("_etext")) {
        code.push((a, b));
    }
    code.push((0xffff_ffff_c000_0000, 0xffff_ffff_ff00_0000));
    code
}

pub struct Plan {
    /// By trap id.
    pub traps: Vec<(u64, Meaning)>,
    pub text: String,
}

pub fn build(
    layout: &Layout,
    kernel_symbols: Option<&str>,
    stack_bytes: usize,
    sample_every: Option<u64>,
) -> Result<Plan, VmError> {
    let mut traps: Vec<(u64, Meaning)> = Vec::new();
    let mut text = format!("stack {stack_bytes}\n");
    if let Some(n) = sample_every {
        text.push_str(&format!("sample {n}\n"));
    }
    let entry = {
        let main = &layout.modules[0];
        let file = object::File::parse(&*main.data)
            .map_err(|e| VmError::damaged(format!("{}: {e}", main.path.display())))?;
        file.entry().wrapping_add(main.bias)
    };
    text.push_str(&format!("trap {entry:x} 0 user none noret any - -\n"));
    traps.push((entry, Meaning::Start));
    for (name, trap) in TRAPPED {
        if matches!(trap, Trap::Exit) {
            continue;
        }
        // The first definition in the loader's search order wins, as it
        // does for the program's calls.
        let Some(addr) = layout.modules.iter().find_map(|m| defined(m, name)) else {
            continue;
        };
        if traps.iter().any(|(a, _)| *a == addr) {
            continue;
        }
        let out = if matches!(trap, Trap::Allocation(AllocFn::PosixMemalign)) {
            "out"
        } else {
            "-"
        };
        text.push_str(&format!(
            "trap {addr:x} {} user raw ret any - {out}\n",
            traps.len()
        ));
        traps.push((addr, Meaning::User(*trap)));
    }
    if !traps
        .iter()
        .any(|(_, m)| matches!(m, Meaning::User(Trap::Allocation(AllocFn::Malloc))))
    {
        return Err(VmError::cannot_run(format!(
            "no malloc in {} or its libraries: nothing to trap",
            layout.modules[0].path.display()
        )));
    }
    for (name, call) in SYNC_TRAPPED {
        // Every version a library defines (glibc keeps an old
        // `pthread_cond_wait@GLIBC_2.2.5`): a program binds to one.
        let Some(addrs) = layout
            .modules
            .iter()
            .map(|m| definitions(m, name))
            .find(|a| !a.is_empty())
        else {
            continue;
        };
        let peek = match call {
            SyncCall::Acquire(LockClass::Mutex, ..)
            | SyncCall::Release(LockClass::Mutex)
            | SyncCall::Destroy(LockClass::Mutex) => format!("{MUTEX_KIND_OFFSET:x}"),
            _ => "-".into(),
        };
        let out = match call {
            SyncCall::Init(LockClass::Mutex) => format!("out+{MUTEX_KIND_OFFSET:x}"),
            SyncCall::Create => "out".into(),
            _ => "-".into(),
        };
        let ret = if *call == SyncCall::Exit {
            "noret"
        } else {
            "ret"
        };
        for addr in addrs {
            if traps.iter().any(|(a, _)| *a == addr) {
                continue;
            }
            text.push_str(&format!(
                "trap {addr:x} {} user raw {ret} any {peek} {out}\n",
                traps.len()
            ));
            traps.push((addr, Meaning::Sync(*call)));
        }
    }
    for m in &layout.modules {
        for (a, b) in m.code() {
            text.push_str(&format!("watch {a:x} {b:x}\n"));
        }
    }
    if let Some(symbols) = kernel_symbols {
        let index = kernel_index(symbols);
        for (name, call) in KERNEL_TRAPPED {
            let found = index
                .get(&format!("{name}_noprof"))
                .or_else(|| index.get(*name));
            let Some(&addr) = found else { continue };
            if traps.iter().any(|(a, _)| *a == addr) {
                continue;
            }
            let (stack, who) = match call {
                KernelCall::Release(..) => ("none", "any"),
                KernelCall::ReleaseBulk => ("array", "any"),
                _ => ("scan", "process"),
            };
            let peek = match call {
                KernelCall::Allocate(_, SizeFrom::Peeked) => format!("{KMEM_CACHE_OBJECT_SIZE:x}"),
                _ => "-".into(),
            };
            text.push_str(&format!(
                "trap {addr:x} {} kernel {stack} ret {who} {peek} -\n",
                traps.len()
            ));
            traps.push((addr, Meaning::Kernel(*call)));
        }
        if !traps
            .iter()
            .any(|(_, m)| matches!(m, Meaning::Kernel(KernelCall::Release(AllocFn::Kfree, _))))
        {
            return Err(VmError::damaged(
                "the recording's kernel symbols have no kfree: the dump is incomplete".into(),
            ));
        }
        let Some(&end) = index.get("exit_mmap") else {
            return Err(VmError::damaged(
                "the recording's kernel symbols have no exit_mmap: the dump is incomplete".into(),
            ));
        };
        text.push_str(&format!(
            "trap {end:x} {} kernel none noret end - -\n",
            traps.len()
        ));
        traps.push((end, Meaning::End));
        for (a, b) in kernel_code(symbols) {
            text.push_str(&format!("watch {a:x} {b:x}\nktext {a:x} {b:x}\n"));
        }
    }
    Ok(Plan { traps, text })
}

fn kernel_index(symbols: &str) -> std::collections::HashMap<String, u64> {
    let mut index = std::collections::HashMap::new();
    for line in symbols.lines() {
        let mut w = line.split_whitespace();
        let (Some(a), Some(kind), Some(name)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        if matches!(kind, "t" | "T") && w.next().is_none() {
            if let Ok(addr) = u64::from_str_radix(a, 16) {
                index.entry(name.to_string()).or_insert(addr);
            }
        }
    }
    index
}

/// The guest address of function `name` defined in module `m`.
fn defined(m: &Loaded, name: &str) -> Option<u64> {
    definitions(m, name).first().copied()
}

/// The guest addresses of every definition of function `name` in module
/// `m` (a versioned symbol may have several), in symbol table order.
fn definitions(m: &Loaded, name: &str) -> Vec<u64> {
    let Ok(file) = object::File::parse(&*m.data) else {
        return Vec::new();
    };
    let mut found: Vec<u64> = Vec::new();
    for s in file.dynamic_symbols().chain(file.symbols()) {
        if s.is_definition()
            && s.kind() == object::SymbolKind::Text
            && s.name()
                .is_ok_and(|n| n == name || n.split('@').next() == Some(name))
        {
            let addr = s.address().wrapping_add(m.bias);
            if !found.contains(&addr) {
                found.push(addr);
            }
        }
    }
    found
}

/// The unwind sections of a module, for framehop.
pub struct UnwindSections {
    pub text: Option<(u64, u64)>,
    pub eh_frame: Option<(u64, Vec<u8>)>,
    pub eh_frame_hdr: Option<(u64, Vec<u8>)>,
}

pub fn unwind_sections(m: &Loaded) -> UnwindSections {
    let Ok(file) = object::File::parse(&*m.data) else {
        return UnwindSections {
            text: None,
            eh_frame: None,
            eh_frame_hdr: None,
        };
    };
    let section = |name: &str| {
        file.section_by_name(name)
            .and_then(|s| Some((s.address(), s.data().ok()?.to_vec())))
    };
    UnwindSections {
        text: file
            .section_by_name(".text")
            .map(|s| (s.address(), s.address() + s.size())),
        eh_frame: section(".eh_frame"),
        eh_frame_hdr: section(".eh_frame_hdr"),
    }
}
