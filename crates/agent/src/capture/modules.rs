//! The loaded modules: found with dl_iterate_phdr, written to the trace as
//! the module map (path, build id, bias, segments), and handed to the
//! unwinders (framehop, and rules.rs's CFI reader) as unwind tables read
//! straight from the mapped `.eh_frame_hdr` / `.eh_frame`.
//!
//! The unwinders are immutable once built; a module change (dlopen, dlclose)
//! builds a new one and publishes it through an atomic pointer, so unwinding
//! (including from signal handlers) never takes a lock. Old unwinders are kept
//! alive for threads that may still be using them.

use crate::platform::arch::ArchUnwinder;
use crate::platform::callback::Callback;
use crate::platform::lock::RawLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use trapline_trace::event::segment_flags;
use trapline_trace::{ModuleInfo, Segment};

/// The architecture's unwinder over the mapped module bytes.
pub type Unwinder = ArchUnwinder<MappedBytes>;

/// Memory of a loaded module, viewed as a byte slice without copying.
pub struct MappedBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are read-only mapped module data, never written by anyone.
unsafe impl Send for MappedBytes {}
// SAFETY: as above; shared reads of immutable memory are fine.
unsafe impl Sync for MappedBytes {}

impl core::ops::Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: constructed only over ranges inside a readable PT_LOAD segment
        // of a module that stays mapped while its unwinder is in use.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// One scanned module.
#[derive(Clone)]
struct Scanned {
    name: String,
    bias: u64,
    segments: Vec<Segment>,
    build_id: Vec<u8>,
    /// (address, size) of .eh_frame_hdr in memory.
    eh_frame_hdr: Option<(u64, u64)>,
}

impl Scanned {
    /// The addresses the module spans, [start, end) over its segments.
    fn extent(&self) -> (u64, u64) {
        let lo = self.segments.iter().map(|s| s.start).min().unwrap_or(0);
        let hi = self.segments.iter().map(|s| s.end).max().unwrap_or(0);
        (lo, hi)
    }
}

struct Registry {
    known: Vec<(u32, Scanned)>,
    next_id: u32,
    /// Every unwinder ever published (never freed: a thread may still be
    /// walking one), with the modules it was built from when they can be
    /// told apart by content (see `ModuleSet`).
    all_unwinders: Vec<(*mut Unwinders, Option<ModuleSet>)>,
}

/// The modules an unwinder was built from, by content: path, load bias,
/// build id and unwind table. A program that loads and unloads the same
/// library over and over (a plugin reloaded) goes back to a set of modules
/// it had before, and gets that set's unwinder again instead of a new one:
/// with one per change, 2,000 dlopen/dlclose cycles of libz cost the agent
/// 28 MB. Only sets whose every module has a build id are compared (without
/// it, another build of a library at the same path and address would look
/// the same).
#[derive(PartialEq, Eq)]
struct ModuleSet(Vec<ModuleKey>);

/// Path, load bias, build id, and where `.eh_frame_hdr` is.
type ModuleKey = (String, u64, Vec<u8>, Option<(u64, u64)>);

impl ModuleSet {
    fn of(known: &[(u32, Scanned)]) -> Option<ModuleSet> {
        let mut set = Vec::with_capacity(known.len());
        for (_, m) in known {
            if m.build_id.is_empty() {
                return None;
            }
            set.push((m.name.clone(), m.bias, m.build_id.clone(), m.eh_frame_hdr));
        }
        set.sort();
        Some(ModuleSet(set))
    }
}

struct Modules {
    lock: RawLock,
    reg: UnsafeCell<Registry>,
}
// SAFETY: `reg` is only accessed with `lock` held.
unsafe impl Sync for Modules {}

static MODULES: Modules = Modules {
    lock: RawLock::new(),
    reg: UnsafeCell::new(Registry {
        known: Vec::new(),
        next_id: 1,
        all_unwinders: Vec::new(),
    }),
};
static UNWINDER: AtomicPtr<Unwinders> = AtomicPtr::new(core::ptr::null_mut());
static GENERATION: AtomicU32 = AtomicU32::new(0);
static AGENT_START: AtomicU64 = AtomicU64::new(0);
static AGENT_END: AtomicU64 = AtomicU64::new(0);

/// The current unwinder and its generation (changes whenever modules change).
pub fn unwinder() -> Option<(&'static Unwinders, u32)> {
    let p = UNWINDER.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: published unwinders are leaked boxes that are never freed.
    Some((unsafe { &*p }, GENERATION.load(Ordering::Acquire)))
}

/// True if `pc` is code of the agent itself (those frames are cut from stacks).
#[inline]
pub fn is_agent_pc(pc: u64) -> bool {
    let (start, end) = agent_code();
    pc >= start && pc < end
}

/// The agent's code, [start, end): for loops that test many frames.
#[inline]
pub fn agent_code() -> (u64, u64) {
    (
        AGENT_START.load(Ordering::Relaxed),
        AGENT_END.load(Ordering::Relaxed),
    )
}

fn read_build_id(note_start: u64, note_len: u64) -> Option<Vec<u8>> {
    let mut p = note_start;
    let end = note_start + note_len;
    let align4 = |x: u64| (x + 3) & !3;
    while p + 12 <= end {
        // SAFETY: the PT_NOTE segment lies in a loaded, readable segment.
        let (namesz, descsz, ty) = unsafe {
            (
                core::ptr::read_unaligned(p as *const u32) as u64,
                core::ptr::read_unaligned((p + 4) as *const u32) as u64,
                core::ptr::read_unaligned((p + 8) as *const u32),
            )
        };
        let name = p + 12;
        let desc = name + align4(namesz);
        let next = desc + align4(descsz);
        if next > end {
            return None;
        }
        // SAFETY: name..name+4 lies within the note (checked against `end`).
        if ty == 3
            && namesz == 4
            && unsafe { core::slice::from_raw_parts(name as *const u8, 4) } == b"GNU\0"
        {
            // SAFETY: desc..desc+descsz lies within the note.
            return Some(
                unsafe { core::slice::from_raw_parts(desc as *const u8, descsz as usize) }.to_vec(),
            );
        }
        p = next;
    }
    None
}

/// The executable's path as the process was started by (`redis-server`,
/// not `redis-check-rdb`, the file its symlink names), when that path is
/// still the executable; else its real path.
pub fn exe_path() -> String {
    static STARTED_AS: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let real = real_exe_path();
    match STARTED_AS.get_or_init(started_as) {
        Some(named) if *named != real && same_file(named, &real) => named.clone(),
        _ => real,
    }
}

/// The path execve was given (AT_EXECFN), made absolute: read once, early,
/// in the directory the process started in.
fn started_as() -> Option<String> {
    // SAFETY: getauxval has no preconditions.
    let at = unsafe { libc::getauxval(libc::AT_EXECFN) };
    if at == 0 {
        return None;
    }
    // SAFETY: the kernel's NUL-terminated copy of the path, at the top of
    // the initial stack, which the process does not unmap.
    let path = unsafe { core::ffi::CStr::from_ptr(at as *const core::ffi::c_char) };
    let path = std::path::absolute(path.to_str().ok()?).ok()?;
    Some(path.to_str()?.to_owned())
}

fn same_file(a: &str, b: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The executable's real path. Through /proc/thread-self: once the main
/// thread has left through pthread_exit, /proc/self/exe (its zombie's) is
/// unreadable.
fn real_exe_path() -> String {
    let mut buf = [0u8; 4096];
    let mut n = -1;
    for link in [c"/proc/thread-self/exe", c"/proc/self/exe"] {
        // SAFETY: readlink writes at most buf.len() bytes into buf.
        n = unsafe { libc::readlink(link.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            break;
        }
    }
    if n > 0 {
        String::from_utf8_lossy(&buf[..n as usize]).into_owned()
    } else {
        String::new()
    }
}

unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut libc::c_void,
) -> i32 {
    // SAFETY: dl_iterate_phdr passes a valid info; `data` is the Vec we passed.
    let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Scanned>)) };
    let name = crate::platform::sys::loader_path(info.dlpi_name);
    let bias = info.dlpi_addr;
    let mut segments = Vec::new();
    let mut build_id = Vec::new();
    let mut eh_frame_hdr = None;
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let start = bias.wrapping_add(ph.p_vaddr);
        match ph.p_type {
            libc::PT_LOAD => {
                let mut flags = 0;
                if ph.p_flags & libc::PF_R != 0 {
                    flags |= segment_flags::READ;
                }
                if ph.p_flags & libc::PF_W != 0 {
                    flags |= segment_flags::WRITE;
                }
                if ph.p_flags & libc::PF_X != 0 {
                    flags |= segment_flags::EXEC;
                }
                segments.push(Segment {
                    start,
                    end: start + ph.p_memsz,
                    flags,
                });
            }
            libc::PT_NOTE if build_id.is_empty() => {
                build_id = read_build_id(start, ph.p_memsz).unwrap_or_default();
            }
            libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some((start, ph.p_memsz)),
            _ => {}
        }
    }
    out.push(Scanned {
        name,
        bias,
        segments,
        build_id,
        eh_frame_hdr,
    });
    0
}

fn scan() -> Vec<Scanned> {
    let mut out: Vec<Scanned> = Vec::new();
    // SAFETY: `collect` matches the callback signature and only uses `out`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(collect),
            &mut out as *mut Vec<Scanned> as *mut libc::c_void,
        )
    };
    let exe = exe_path();
    let own = scan as *const () as usize as u64;
    for (i, m) in out.iter_mut().enumerate() {
        if i == 0 && m.name.is_empty() {
            m.name = exe.clone();
        }
        let (lo, hi) = m.extent();
        if own >= lo && own < hi {
            AGENT_START.store(lo, Ordering::Relaxed);
            AGENT_END.store(hi, Ordering::Relaxed);
        }
    }
    out.retain(|m| !m.segments.is_empty());
    out
}

/// The addresses spanned by the loaded module that holds `pc`.
pub fn extent_of(pc: u64) -> Option<(u64, u64)> {
    scan()
        .iter()
        .map(Scanned::extent)
        .find(|&(lo, hi)| pc >= lo && pc < hi)
}

/// Reads the .eh_frame pointer out of .eh_frame_hdr.
fn eh_frame_from_hdr(hdr: u64, hdr_len: u64) -> Option<u64> {
    if hdr_len < 8 {
        return None;
    }
    // SAFETY: the header lies in a readable segment (PT_GNU_EH_FRAME).
    let (version, enc) = unsafe { (*(hdr as *const u8), *((hdr + 1) as *const u8)) };
    if version != 1 {
        return None;
    }
    let field = hdr + 4;
    // SAFETY: the encoded pointer follows the 4-byte header, within hdr_len.
    unsafe {
        match enc {
            0x1b => Some(
                field.wrapping_add(core::ptr::read_unaligned(field as *const i32) as i64 as u64),
            ),
            0x03 | 0x00 if hdr_len >= 12 => Some(core::ptr::read_unaligned(field as *const u64)),
            _ => None,
        }
    }
}

/// Where a module's CFI is mapped.
struct CfiSections {
    /// .eh_frame_hdr (address, size).
    hdr: (u64, u64),
    /// .eh_frame, up to the end of its segment (its size is not recorded).
    eh_frame: (u64, u64),
    text: Segment,
    /// The module's whole address range.
    range: (u64, u64),
}

fn cfi_sections(m: &Scanned) -> Option<CfiSections> {
    let (hdr, hdr_len) = m.eh_frame_hdr?;
    let eh = eh_frame_from_hdr(hdr, hdr_len)?;
    let eh_seg = m.segments.iter().find(|s| s.start <= eh && eh < s.end)?;
    let text = m
        .segments
        .iter()
        .find(|s| s.flags & segment_flags::EXEC != 0)?;
    let lo = m.segments.iter().map(|s| s.start).min()?;
    let hi = m.segments.iter().map(|s| s.end).max()?;
    Some(CfiSections {
        hdr: (hdr, hdr_len),
        eh_frame: (eh, eh_seg.end - eh),
        text: text.clone(),
        range: (lo, hi),
    })
}

fn mapped((ptr, len): (u64, u64)) -> MappedBytes {
    MappedBytes {
        ptr: ptr as *const u8,
        len: len as usize,
    }
}

fn framehop_module(m: &Scanned, c: &CfiSections) -> Module<MappedBytes> {
    let svma = |a: u64| a - m.bias;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(svma(c.text.start)..svma(c.text.end)),
        eh_frame_svma: Some(svma(c.eh_frame.0)..svma(c.eh_frame.0 + c.eh_frame.1)),
        eh_frame: Some(mapped(c.eh_frame)),
        eh_frame_hdr_svma: Some(svma(c.hdr.0)..svma(c.hdr.0 + c.hdr.1)),
        eh_frame_hdr: Some(mapped(c.hdr)),
        text: None,
        stubs_svma: None,
        stub_helper_svma: None,
        got_svma: None,
        unwind_info: None,
        debug_frame: None,
        text_segment_svma: None,
        text_segment: None,
    };
    Module::new(m.name.clone(), c.range.0..c.range.1, m.bias, info)
}

/// A module's CFI as rules.rs reads it: the sections in place, and their
/// addresses for gimli, so that CFI addresses come out as run-time addresses.
pub struct CfiModule {
    pub start: u64,
    pub end: u64,
    pub eh_frame_hdr: MappedBytes,
    pub eh_frame: MappedBytes,
    pub bases: gimli::BaseAddresses,
}

fn cfi_module(c: &CfiSections) -> CfiModule {
    CfiModule {
        start: c.range.0,
        end: c.range.1,
        eh_frame_hdr: mapped(c.hdr),
        eh_frame: mapped(c.eh_frame),
        bases: gimli::BaseAddresses::default()
            .set_eh_frame_hdr(c.hdr.0)
            .set_eh_frame(c.eh_frame.0)
            .set_text(c.text.start),
    }
}

/// What unwinding needs of the loaded modules, published together.
pub struct Unwinders {
    pub framehop: Unwinder,
    /// Modules with CFI, sorted by address.
    pub cfi: Vec<CfiModule>,
}

impl Unwinders {
    /// The module whose address range holds `address`.
    pub fn cfi_module(&self, address: u64) -> Option<&CfiModule> {
        let i = self.cfi.partition_point(|m| m.start <= address);
        self.cfi[..i].last().filter(|m| address < m.end)
    }
}

fn same(a: &Scanned, b: &Scanned) -> bool {
    a.name == b.name && a.bias == b.bias
}

/// Changes since the last refresh, as trace records.
pub struct Changes {
    pub loaded: Vec<ModuleInfo>,
    pub unloaded: Vec<u32>,
}

fn info(id: u32, m: &Scanned) -> ModuleInfo {
    ModuleInfo {
        id,
        path: m.name.clone(),
        build_id: m.build_id.clone(),
        bias: m.bias,
        segments: m.segments.clone(),
    }
}

/// Rescans the modules; rebuilds and publishes the unwinder if they changed.
pub fn refresh() -> Changes {
    let now = scan();
    let _g = MODULES.lock.guard();
    // SAFETY: guarded by MODULES.lock.
    let reg = unsafe { &mut *MODULES.reg.get() };
    let mut changes = Changes {
        loaded: Vec::new(),
        unloaded: Vec::new(),
    };
    reg.known.retain(|(id, k)| {
        let keep = now.iter().any(|m| same(m, k));
        if !keep {
            changes.unloaded.push(*id);
        }
        keep
    });
    for m in &now {
        if !reg.known.iter().any(|(_, k)| same(m, k)) {
            let id = reg.next_id;
            reg.next_id += 1;
            changes.loaded.push(info(id, m));
            reg.known.push((id, m.clone()));
        }
    }
    if !changes.loaded.is_empty()
        || !changes.unloaded.is_empty()
        || UNWINDER.load(Ordering::Acquire).is_null()
    {
        let set = ModuleSet::of(&reg.known);
        let earlier = set.as_ref().and_then(|set| {
            reg.all_unwinders
                .iter()
                .find(|(_, s)| s.as_ref() == Some(set))
                .map(|(p, _)| *p)
        });
        let p = match earlier {
            Some(p) => p,
            None => {
                let mut u = Unwinders {
                    framehop: Unwinder::new(),
                    cfi: Vec::new(),
                };
                for (_, m) in &reg.known {
                    if let Some(c) = cfi_sections(m) {
                        u.framehop.add_module(framehop_module(m, &c));
                        u.cfi.push(cfi_module(&c));
                    }
                }
                u.cfi.sort_by_key(|m| m.start);
                let p = Box::into_raw(Box::new(u));
                reg.all_unwinders.push((p, set));
                p
            }
        };
        UNWINDER.store(p, Ordering::Release);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        if let Some(on_change) = ON_CHANGE.get() {
            on_change();
        }
    }
    changes
}

/// What `refresh` calls once the unwinder has changed: the rule cache above
/// forgets the rules it took from the old one (`on_change`).
static ON_CHANGE: Callback<fn()> = Callback::new();

/// Registers what to call whenever the set of modules changes.
pub fn on_change(f: fn()) {
    ON_CHANGE.set(f);
}

/// Every module currently known, as trace records (a fork child re-announces them).
pub fn all() -> Vec<ModuleInfo> {
    let _g = MODULES.lock.guard();
    // SAFETY: guarded by MODULES.lock.
    let reg = unsafe { &*MODULES.reg.get() };
    reg.known.iter().map(|(id, m)| info(*id, m)).collect()
}

pub fn reset_lock() {
    MODULES.lock.reset();
}
