//! Turns code addresses from a trace into functions, files, lines and inlined frames.
//!
//! INTERFACE STUB: the signatures below are the contract used by the analyses;
//! the implementation (addr2line/object over the module files, demangling,
//! caches) replaces the bodies.

use trapline_trace::ModuleInfo;

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
}

/// Symbolizes addresses of one traced process.
#[derive(Default)]
pub struct Symbolizer {
    modules: Vec<ModuleInfo>,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a module from a `ModuleLoad` event.
    pub fn add_module(&mut self, module: &ModuleInfo) {
        self.modules.push(module.clone());
    }

    /// Symbolizes a return address (the lookup uses `address - 1`, inside the call).
    /// Always returns at least one frame.
    pub fn symbolize(&mut self, address: u64) -> Vec<Frame> {
        let module = self
            .modules
            .iter()
            .find(|m| m.segments.iter().any(|s| s.start <= address && address < s.end))
            .map(|m| m.path.clone());
        vec![Frame { address, function: None, file: None, line: None, inlined: false, module }]
    }
}
