//! One module's debug information: DWARF through addr2line, and its symbol
//! tables as the fallback.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use addr2line::{LookupContinuation, LookupResult, SplitDwarfLoad};
use gimli::Reader as _;
use object::{CompressionFormat, Object, ObjectSection};

use crate::debugfile::{self, LoadedFile};
use crate::symtab::SymbolTable;
use crate::wrapper::Code;

/// Owned DWARF data: the context can live without borrowing a file buffer.
type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// More inlined frames than this at one address means looping DWARF.
const MAX_FRAMES: usize = 256;

/// One source frame, before the address and module are attached.
#[derive(Default)]
pub(crate) struct RawFrame {
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: Option<u32>,
}

/// What could be loaded for one module file.
pub(crate) struct ModuleDebug {
    dwarf: Option<addr2line::Context<Reader>>,
    symbols: SymbolTable,
    /// A kernel symbol map: frames are named `function+offset`.
    kernel_map: bool,
    /// The module's machine code, for recognising allocation wrappers.
    code: Option<Code>,
}

/// The file name ending of a kernel symbol map that a trace names as a
/// module (`trapline vm replay` writes one beside its trace).
pub const KERNEL_MAP_SUFFIX: &str = ".kallsyms";

/// The result of loading: the module's debug info plus warnings that do not
/// prevent its use.
pub(crate) struct Loaded {
    pub(crate) debug: ModuleDebug,
    pub(crate) warnings: Vec<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ModuleDebug {
    /// Loads `path`, checking it is the build the trace saw.
    ///
    /// On `Err` the module must stay unsymbolized; the message says why.
    pub(crate) fn load(
        path: &Path,
        expected_build_id: &[u8],
        debug_dirs: &[PathBuf],
    ) -> Result<Loaded, String> {
        let shown = path.display();
        let file =
            debugfile::read_file(path).map_err(|e| format!("{shown}: cannot read it ({e})"))?;
        if path.to_string_lossy().ends_with(KERNEL_MAP_SUFFIX) && !file.data.starts_with(b"\x7fELF")
        {
            let mut symbols = SymbolTable::default();
            symbols.add_kernel_map(&String::from_utf8_lossy(&file.data));
            symbols.finish();
            return Ok(Loaded {
                debug: ModuleDebug {
                    dwarf: None,
                    symbols,
                    kernel_map: true,
                    code: None,
                },
                warnings: Vec::new(),
            });
        }
        let object = object::File::parse(&*file.data)
            .map_err(|e| format!("{shown}: not a readable ELF file ({e})"))?;
        if !expected_build_id.is_empty() {
            match object.build_id() {
                Ok(Some(id)) if id == expected_build_id => {}
                Ok(Some(id)) => {
                    return Err(format!(
                        "{shown}: build id {} differs from the traced {} (rebuilt or replaced since the trace)",
                        hex(id),
                        hex(expected_build_id)
                    ))
                }
                _ => {
                    return Err(format!(
                        "{shown}: has no build id, the traced one had {} (rebuilt or replaced since the trace)",
                        hex(expected_build_id)
                    ))
                }
            }
        }

        let mut warnings = Vec::new();
        let mut symbols = SymbolTable::default();
        symbols.add_file(&object);

        let found = if has_dwarf(&object) {
            None
        } else {
            debugfile::find_debug_file(path, &object, debug_dirs)
        };
        let found = found
            .as_ref()
            .map(|found| (found, object::File::parse(&*found.data)));
        let (dwarf_file, dwarf_object) = match &found {
            Some((found, Ok(found_object))) => {
                // Stripped files keep only .dynsym; the debug file has the full .symtab.
                symbols.add_file(found_object);
                (*found, found_object)
            }
            Some((found, Err(e))) => {
                warnings.push(format!(
                    "{}: separate debug file is not a readable ELF file ({e})",
                    found.path.display()
                ));
                (&file, &object)
            }
            None => (&file, &object),
        };
        symbols.finish();

        let dwarf = if has_dwarf(dwarf_object) {
            match build_context(dwarf_file, dwarf_object, debug_dirs) {
                Ok(context) => Some(context),
                Err(e) => {
                    warnings.push(format!(
                        "{}: debug info is unreadable ({e}); using the symbol table only",
                        dwarf_file.path.display()
                    ));
                    None
                }
            }
        } else {
            None
        };
        Ok(Loaded {
            debug: ModuleDebug {
                dwarf,
                symbols,
                kernel_map: false,
                code: std::fs::File::open(path)
                    .ok()
                    .and_then(|code_file| Code::new(code_file, &object)),
            },
            warnings,
        })
    }

    /// Whether anything at all can be said about this module's addresses.
    pub(crate) fn has_anything(&self) -> bool {
        self.dwarf.is_some() || !self.symbols.is_empty()
    }

    /// Whether the function containing file virtual address `probe` is an
    /// allocation wrapper by its code (wrapper.rs); `known` tells wrappers
    /// by name.
    pub(crate) fn is_allocation_wrapper(
        &mut self,
        probe: u64,
        known: &dyn Fn(&str) -> bool,
    ) -> bool {
        match &mut self.code {
            Some(code) => code.is_wrapper_at(probe, &self.symbols, known),
            None => false,
        }
    }

    /// The frames at file virtual address `probe`, innermost inlined first;
    /// at least one.
    pub(crate) fn resolve(&self, probe: u64) -> Vec<RawFrame> {
        if self.kernel_map {
            // The return address, one past the probe, as the kernel prints it.
            let function = self
                .symbols
                .lookup_start(probe)
                .map(|(start, name)| format!("{name}+{:#x}", probe + 1 - start));
            return vec![RawFrame {
                function,
                ..RawFrame::default()
            }];
        }
        let mut frames = Vec::new();
        if let Some(context) = &self.dwarf {
            let mut lookup = context.find_frames(probe);
            let found = loop {
                match lookup {
                    LookupResult::Output(found) => break found,
                    LookupResult::Load { load, continuation } => {
                        lookup = continuation.resume(load_dwo(&load));
                    }
                }
            };
            if let Ok(mut iter) = found {
                // Stop at the first error: what was read so far is still right.
                while let Ok(Some(frame)) = iter.next() {
                    let function = frame
                        .function
                        .and_then(|f| f.demangle().ok().map(|n| n.into_owned()));
                    let (file, line) = match frame.location {
                        Some(location) => (location.file.map(str::to_owned), location.line),
                        None => (None, None),
                    };
                    frames.push(RawFrame {
                        function,
                        file,
                        line,
                    });
                    if frames.len() >= MAX_FRAMES {
                        break;
                    }
                }
            }
        }
        if frames.is_empty() {
            frames.push(RawFrame::default());
        }
        if let Some(outer) = frames.last_mut() {
            match &outer.function {
                None => outer.function = self.symbols.lookup(probe).map(demangle_symbol),
                // GCC gives C++ functions with internal linkage (static, or
                // in an anonymous namespace) no DW_AT_linkage_name, so DWARF
                // says `f` where the symbol table's `_ZL1fv` says `f()`. Use
                // the full signature, as for every other C++ function.
                Some(name) if !name.contains('(') => {
                    if let Some(full) = self
                        .symbols
                        .lookup(probe)
                        .filter(|s| s.starts_with("_Z"))
                        .map(demangle_symbol)
                        .filter(|full| {
                            full.strip_prefix(name.as_str())
                                .is_some_and(|rest| rest.starts_with('('))
                        })
                    {
                        outer.function = Some(full);
                    }
                }
                Some(_) => {}
            }
        }
        frames
    }
}

/// Demangles a symbol table name, whose language is unknown.
fn demangle_symbol(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

fn has_dwarf(object: &object::File<'_>) -> bool {
    object
        .section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0)
}

fn endian(object: &object::File<'_>) -> gimli::RunTimeEndian {
    if object.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    }
}

/// Builds the addr2line context from the DWARF of `file`, with its dwz
/// supplementary file if it has one.
fn build_context(
    file: &LoadedFile,
    object: &object::File<'_>,
    debug_dirs: &[PathBuf],
) -> Result<addr2line::Context<Reader>, gimli::Error> {
    let mut dwarf = load_dwarf(file, object, |id| Some(id.name()));
    if let Some(sup) = debugfile::find_sup_file(file, object, debug_dirs) {
        if let Ok(sup_object) = object::File::parse(&*sup.data) {
            dwarf.set_sup(load_dwarf(&sup, &sup_object, |id| Some(id.name())));
        }
    }
    dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
    addr2line::Context::from_dwarf(dwarf)
}

fn load_dwarf(
    file: &LoadedFile,
    object: &object::File<'_>,
    name: impl Fn(gimli::SectionId) -> Option<&'static str>,
) -> gimli::Dwarf<Reader> {
    let endian = endian(object);
    let empty: Arc<[u8]> = Arc::new([]);
    let loaded: Result<_, std::convert::Infallible> = gimli::Dwarf::load(|id| {
        let data = name(id)
            .and_then(|name| section_data(file, object, name))
            .unwrap_or_else(|| empty.clone());
        Ok(Reader::new(data, endian))
    });
    match loaded {
        Ok(dwarf) => dwarf,
        Err(never) => match never {},
    }
}

/// A section's bytes; missing, unreadable and absurdly compressed sections
/// give `None` (treated as empty).
fn section_data(file: &LoadedFile, object: &object::File<'_>, name: &str) -> Option<Arc<[u8]>> {
    let section = object.section_by_name(name)?;
    let range = section.compressed_file_range().ok()?;
    if range.format == CompressionFormat::None {
        let start = usize::try_from(range.offset).ok()?;
        let end = start.checked_add(usize::try_from(range.uncompressed_size).ok()?)?;
        // Copy rather than share the whole file: DWARF is a fraction of most
        // files and the rest can then be freed.
        return Some(file.data.get(start..end)?.into());
    }
    // The header's size is untrusted; zlib and zstd ratios stay far below this.
    let limit = range
        .compressed_size
        .saturating_mul(4096)
        .saturating_add(1 << 20);
    if range.uncompressed_size > limit {
        return None;
    }
    Some(section.uncompressed_data().ok()?.into_owned().into())
}

/// Loads a split DWARF (`-gsplit-dwarf`) `.dwo` file next to its compilation.
/// `.dwp` packages are not searched.
fn load_dwo(load: &SplitDwarfLoad<Reader>) -> Option<Arc<gimli::Dwarf<Reader>>> {
    let mut path = PathBuf::new();
    if let Some(dir) = &load.comp_dir {
        path.push(OsStr::from_bytes(&dir.to_slice().ok()?));
    }
    path.push(OsStr::from_bytes(&load.path.as_ref()?.to_slice().ok()?));
    let file = debugfile::read_file(&path).ok()?;
    let object = object::File::parse(&*file.data).ok()?;
    let mut dwarf = load_dwarf(&file, &object, |id| id.dwo_name());
    let header = dwarf.units().next().ok()??;
    // A stale .dwo from another build would give wrong lines.
    if dwarf.unit(header).ok()?.dwo_id != Some(load.dwo_id) {
        return None;
    }
    dwarf.make_dwo(&load.parent);
    Some(Arc::new(dwarf))
}
