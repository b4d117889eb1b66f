//! Turns code addresses from a trace into functions, files, lines and inlined frames.
//!
//! Modules come from the trace's `ModuleLoad` events. A module's file is read
//! only when one of its addresses is first symbolized; its DWARF (in the file
//! itself, in a separate debug file found by build id or `.gnu_debuglink`, or
//! in split `.dwo` files) gives functions, lines and inlined frames, and its
//! symbol tables give function names where there is no DWARF. Results are
//! cached per address. A module whose file is gone, unreadable or of another
//! build than the traced one stays unsymbolized and gets a warning (see
//! [`Symbolizer::warnings`]) instead of wrong answers.

#![forbid(unsafe_code)]

mod allocator;
mod block_file;
mod debugfile;
mod module;
mod symtab;
mod wrapper;

pub use allocator::{private_allocator, private_allocator_of, PrivateAllocator};
pub use block_file::BlockFile;
pub use module::KERNEL_MAP_SUFFIX;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use trapline_trace::ModuleInfo;

use module::ModuleDebug;

/// One source-level frame. An address can expand into several when calls were
/// inlined: innermost (inlined) first, the real function last.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The address as recorded (a return address for every frame of a stack).
    pub address: u64,
    /// Demangled function name, if known.
    pub function: Option<String>,
    /// Source file path, if debug info has it.
    pub file: Option<String>,
    /// Source line, if debug info has it.
    pub line: Option<u32>,
    /// True for a frame that was inlined into the next one.
    pub inlined: bool,
    /// Path of the module containing the address, if any.
    pub module: Option<String>,
    /// The address is in a function whose code only passes allocations on
    /// to the allocator (wrapper.rs): it names no allocation site.
    pub allocation_wrapper: bool,
}

impl Frame {
    /// A frame of which only the address is known.
    pub fn unknown(address: u64) -> Frame {
        Frame {
            address,
            function: None,
            file: None,
            line: None,
            inlined: false,
            module: None,
            allocation_wrapper: false,
        }
    }
}

/// Counters of the symbolizer's work, for diagnostics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Calls that asked for one address.
    pub lookups: u64,
    /// Lookups answered from the per-address cache.
    pub hits: u64,
    /// Module files read and parsed (each at most once).
    pub files_loaded: u64,
}

/// Where separate debug files are looked for unless told otherwise.
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";

/// Whether `function` is where the kernel's signal frame returns to (glibc's
/// `__restore_rt` on x86_64, the vDSO's `__kernel_rt_sigreturn` on
/// aarch64). The frame outside it was interrupted, not calling: its address
/// is the next instruction to run, to be looked up with
/// [`Symbolizer::symbolize_pc`] rather than as a return address.
pub fn is_signal_trampoline(function: &str) -> bool {
    matches!(function, "__restore_rt" | "__kernel_rt_sigreturn")
}

/// A registered module.
struct Module {
    info: ModuleInfo,
    /// Index into `Symbolizer::files`.
    file: usize,
}

/// A module file, shared by every module with the same path and build id
/// (a library loaded, unloaded and loaded again is parsed once).
enum FileSlot {
    /// Not read yet.
    Pending,
    Ready(Box<ModuleDebug>),
    /// Missing, unreadable or of another build: its addresses stay unknown.
    Unusable,
}

/// Symbolizes addresses of one traced process.
pub struct Symbolizer {
    /// In registration order; a later module wins where segments overlap.
    modules: Vec<Module>,
    files: Vec<FileSlot>,
    file_index: HashMap<(String, Vec<u8>), usize>,
    cache: HashMap<u64, Vec<Frame>>,
    warnings: Vec<String>,
    /// (file, bias) of a winning module and of a module it hides, for the
    /// overlaps already warned about.
    overlaps_warned: HashSet<[(usize, u64); 2]>,
    debug_dirs: Vec<PathBuf>,
    stats: CacheStats,
    /// Allocation wrappers known by name, which a recognised wrapper may call.
    known_wrappers: fn(&str) -> bool,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Symbolizer {
            modules: Vec::new(),
            files: Vec::new(),
            file_index: HashMap::new(),
            cache: HashMap::new(),
            warnings: Vec::new(),
            overlaps_warned: HashSet::new(),
            debug_dirs: vec![PathBuf::from(DEFAULT_DEBUG_DIR)],
            stats: CacheStats::default(),
            known_wrappers: |_| false,
        }
    }
}

impl Symbolizer {
    /// A symbolizer with no modules, looking for separate debug files in
    /// [`DEFAULT_DEBUG_DIR`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the directories searched for separate debug files
    /// (`DIR/.build-id/xx/rest.debug`, and `DIR/<module dir>/<debuglink>`).
    /// Applies to modules whose files are read afterwards.
    pub fn set_debug_dirs(&mut self, dirs: Vec<PathBuf>) {
        self.debug_dirs = dirs;
    }

    /// Names allocation wrappers known by name (`zmalloc`, ...): a function
    /// whose code calls them as it would the allocator is a wrapper too.
    pub fn set_known_wrappers(&mut self, known: fn(&str) -> bool) {
        self.known_wrappers = known;
    }

    /// Registers a module from a `ModuleLoad` event. Its file is not read
    /// until one of its addresses is symbolized. A module with the id of an
    /// already registered one replaces it.
    pub fn add_module(&mut self, module: &ModuleInfo) {
        self.remove_module(module.id);
        let key = (module.path.clone(), module.build_id.clone());
        let file = match self.file_index.get(&key) {
            Some(&file) => file,
            None => {
                self.files.push(FileSlot::Pending);
                self.file_index.insert(key, self.files.len() - 1);
                self.files.len() - 1
            }
        };
        // Cached answers for these addresses may have come from an older module.
        self.forget_addresses_in(module);
        self.modules.push(Module {
            info: module.clone(),
            file,
        });
    }

    /// Forgets the module with this id (a `ModuleUnload`), so that its
    /// address range can be taken by a later module. Returns whether it was
    /// registered.
    pub fn remove_module(&mut self, id: u32) -> bool {
        let Some(index) = self.modules.iter().position(|m| m.info.id == id) else {
            return false;
        };
        let removed = self.modules.remove(index);
        self.forget_addresses_in(&removed.info);
        true
    }

    fn forget_addresses_in(&mut self, module: &ModuleInfo) {
        if self.cache.is_empty() {
            return;
        }
        self.cache
            .retain(|&address, _| !contains(module, address.wrapping_sub(1)));
    }

    /// Symbolizes a return address (the lookup uses `address - 1`, inside the call).
    /// Always returns at least one frame.
    pub fn symbolize(&mut self, address: u64) -> Vec<Frame> {
        self.symbolize_ref(address).to_vec()
    }

    /// Like [`Symbolizer::symbolize`], without copying the cached frames.
    pub fn symbolize_ref(&mut self, address: u64) -> &[Frame] {
        self.stats.lookups += 1;
        if self.cache.contains_key(&address) {
            self.stats.hits += 1;
        } else {
            let frames = self.resolve(address);
            self.cache.insert(address, frames);
        }
        &self.cache[&address]
    }

    /// Symbolizes an instruction address itself (the interrupted instruction
    /// of a CPU sample), not a return address: the lookup uses `pc`.
    pub fn symbolize_pc(&mut self, pc: u64) -> Vec<Frame> {
        // The cache is keyed by return address; `pc + 1` is the return
        // address whose lookup probes `pc`.
        let mut frames = self.symbolize(pc.wrapping_add(1));
        for f in &mut frames {
            f.address = pc;
        }
        frames
    }

    /// Symbolizes every return address of a stack (innermost first), the
    /// frames of each address in order: a flattened, source-level stack. An
    /// address just outside a signal frame is the interrupted instruction
    /// itself ([`is_signal_trampoline`]).
    pub fn symbolize_stack(&mut self, addresses: &[u64]) -> Vec<Frame> {
        let mut frames: Vec<Frame> = Vec::with_capacity(addresses.len());
        for &address in addresses {
            let interrupted = frames
                .last()
                .and_then(|f| f.function.as_deref())
                .is_some_and(is_signal_trampoline);
            if interrupted {
                frames.extend(self.symbolize_pc(address));
            } else {
                frames.extend_from_slice(self.symbolize_ref(address));
            }
        }
        frames
    }

    /// Problems met so far, one line each, for reports: modules whose file
    /// is missing, unreadable or from another build, and debug info that could
    /// not be read. Files are read lazily, so ask after symbolizing.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Work counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.stats
    }

    fn resolve(&mut self, address: u64) -> Vec<Frame> {
        let unknown = |module: Option<String>| {
            vec![Frame {
                module,
                ..Frame::unknown(address)
            }]
        };
        // Return address 0 cannot follow a call.
        let Some(probe) = address.checked_sub(1) else {
            return unknown(None);
        };
        // The probe, not the return address, picks the module: a call can be
        // the last instruction of a segment.
        let Some(index) = self.modules.iter().rposition(|m| contains(&m.info, probe)) else {
            return unknown(None);
        };
        self.warn_overlaps(index, probe);
        let module = &self.modules[index];
        let path = module.info.path.clone();
        let file_address = probe.wrapping_sub(module.info.bias);
        let slot = module.file;
        if matches!(self.files[slot], FileSlot::Pending) {
            let build_id = module.info.build_id.clone();
            self.files[slot] = self.load(&path, &build_id);
        }
        let FileSlot::Ready(debug) = &mut self.files[slot] else {
            return unknown(Some(path));
        };
        let mut raw = debug.resolve(file_address);
        if raw.iter().all(|f| f.function.is_none()) {
            // A return address at the first byte of a function that no
            // symbol precedes: the kernel's signal frame "returns" to glibc's
            // __restore_rt, whose CFI starts one byte early so that unwinders
            // probing address - 1 find it; symbols do not.
            let at = debug.resolve(file_address.wrapping_add(1));
            if at.iter().any(|f| f.function.is_some()) {
                raw = at;
            }
        }
        let allocation_wrapper = debug.is_allocation_wrapper(file_address, &self.known_wrappers);
        let last = raw.len() - 1;
        raw.into_iter()
            .enumerate()
            .map(|(i, f)| Frame {
                address,
                function: f.function,
                file: f.file,
                line: f.line,
                inlined: i < last,
                module: Some(path.clone()),
                allocation_wrapper,
            })
            .collect()
    }

    /// Warns, once per pair of files, when the module at `index` (the latest
    /// registered containing `probe`) hides an earlier one there that would
    /// give other answers: a library unloaded and another, or the same at
    /// another bias, mapped at its addresses later. Which one a recorded
    /// address meant depends on when it was recorded, which a symbolizer
    /// that sees only addresses cannot tell.
    fn warn_overlaps(&mut self, index: usize, probe: u64) {
        let winner = &self.modules[index];
        for hidden in &self.modules[..index] {
            let same = hidden.file == winner.file && hidden.info.bias == winner.info.bias;
            if same
                || !contains(&hidden.info, probe)
                || !self.overlaps_warned.insert([
                    (winner.file, winner.info.bias),
                    (hidden.file, hidden.info.bias),
                ])
            {
                continue;
            }
            self.warnings.push(format!(
                "{} was mapped where {} had been (both cover {:#x}): frames at those addresses are named after {}, the later one, even in stacks recorded before it was loaded",
                winner.info.path,
                hidden.info.path,
                probe + 1,
                winner.info.path
            ));
        }
    }

    fn load(&mut self, path: &str, build_id: &[u8]) -> FileSlot {
        self.stats.files_loaded += 1;
        if is_vdso(path) {
            // The kernel's vDSO has no file; nothing to warn about.
            return FileSlot::Unusable;
        }
        match ModuleDebug::load(Path::new(path), build_id, &self.debug_dirs) {
            Ok(loaded) => {
                self.warnings.extend(loaded.warnings);
                if loaded.debug.has_anything() {
                    FileSlot::Ready(Box::new(loaded.debug))
                } else {
                    FileSlot::Unusable
                }
            }
            Err(message) => {
                self.warnings
                    .push(format!("{message}; its addresses are left unsymbolized"));
                FileSlot::Unusable
            }
        }
    }
}

fn contains(module: &ModuleInfo, address: u64) -> bool {
    module
        .segments
        .iter()
        .any(|s| s.start <= address && address < s.end)
}

fn is_vdso(path: &str) -> bool {
    path.is_empty()
        || path.starts_with("linux-vdso")
        || path.starts_with("linux-gate")
        || path == "[vdso]"
}
