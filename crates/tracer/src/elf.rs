//! What the recorder needs from the program's file: the entry points it
//! traps, the load segments, the build id and the unwind sections.

use object::{Object, ObjectKind, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags};
pub use trapline_outside::traps::Trap;
use trapline_outside::traps::TRAPPED;

/// A trapped entry point, at its file address.
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: &'static str,
    pub trap: Trap,
    pub addr: u64,
}

/// A load segment at its file address.
pub struct LoadSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub flags: u8,
}

pub struct Program {
    pub entries: Vec<Entry>,
    pub segments: Vec<LoadSegment>,
    pub build_id: Vec<u8>,
    /// Position-independent (`ET_DYN`): loaded at a bias.
    pub relocatable: bool,
    /// `.eh_frame_hdr`, `.eh_frame` and `.text`: (file address, bytes).
    pub eh_frame_hdr: Option<(u64, Vec<u8>)>,
    pub eh_frame: Option<(u64, Vec<u8>)>,
    pub text: Option<(u64, u64)>,
    /// The bytes of the initial thread's static TLS (`PT_TLS`), 0 if none.
    pub tls_size: u64,
    /// The C library's dynamic-loader functions (`_dl_*`, linked into a
    /// static program for TLS, `dlopen` and its link map), at file
    /// addresses, sorted: the blocks they allocate are its bookkeeping, as
    /// ld.so's are in a dynamic program.
    pub loader_code: Vec<(u64, u64)>,
    /// glibc's functions that release, at a thread's or the process's end,
    /// blocks its allocator made for itself without passing through
    /// `malloc` (a thread's tcache): `*freeres*` and `tcache_*`, sorted.
    pub allocator_teardown: Vec<(u64, u64)>,
    /// Every function of the symbol table, `[start, end)`, sorted.
    pub functions: Vec<(u64, u64)>,
    /// The code `.eh_frame` describes, `[start, end)` per FDE, sorted:
    /// elsewhere (musl's C library) frames are unwound by their prologue.
    pub cfi_covers: Vec<(u64, u64)>,
    /// `PT_GNU_RELRO` at its file address: data written at the start and
    /// made read-only, which can hold pointers to blocks.
    pub relro: Option<(u64, u64)>,
}

pub fn read(data: &[u8]) -> Result<Program, String> {
    let file = object::File::parse(data).map_err(|e| format!("not a readable ELF file: {e}"))?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err("not an x86-64 program".into());
    }
    // The defined functions of the symbol table, read once: (name, start, size).
    let functions: Vec<(&str, u64, u64)> = file
        .symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some((s.name().ok()?, s.address(), s.size())))
        .collect();
    let mut entries: Vec<Entry> = Vec::new();
    for (name, trap) in TRAPPED {
        let Some(&(_, addr, _)) = functions.iter().find(|f| f.0 == *name) else {
            continue;
        };
        if entries.iter().any(|e| e.addr == addr) {
            continue;
        }
        entries.push(Entry {
            name,
            trap: *trap,
            addr,
        });
    }
    // The extents of the functions whose name `wanted` accepts, sorted.
    let extents = |wanted: &dyn Fn(&str) -> bool| {
        let mut r: Vec<(u64, u64)> = functions
            .iter()
            .filter(|f| f.2 > 0 && wanted(f.0))
            .map(|f| (f.1, f.1 + f.2))
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    let segments = file
        .segments()
        .filter_map(|s| {
            let SegmentFlags::Elf { p_flags, .. } = s.flags() else {
                return None;
            };
            // PF_X, PF_W, PF_R are the trace's EXEC, WRITE, READ bits.
            let flags = (p_flags.0 & 7) as u8;
            Some(LoadSegment {
                vaddr: s.address(),
                memsz: s.size(),
                flags,
            })
        })
        .collect();
    let section = |name: &str| {
        file.section_by_name(name)
            .and_then(|s| Some((s.address(), s.data().ok()?.to_vec())))
    };
    let eh_frame = section(".eh_frame");
    Ok(Program {
        entries,
        segments,
        build_id: file.build_id().ok().flatten().unwrap_or_default().to_vec(),
        relocatable: file.kind() == ObjectKind::Dynamic,
        eh_frame_hdr: section(".eh_frame_hdr"),
        cfi_covers: eh_frame
            .as_ref()
            .map(|(at, bytes)| fde_ranges(*at, bytes))
            .unwrap_or_default(),
        eh_frame,
        loader_code: extents(&|n| n.starts_with("_dl_")),
        allocator_teardown: extents(&|n| n.contains("freeres") || n.starts_with("tcache_")),
        functions: extents(&|_| true),
        tls_size: program_header(data, object::elf::PT_TLS)
            .map_or(0, |(_, size, align)| size.next_multiple_of(align.max(1))),
        relro: program_header(data, object::elf::PT_GNU_RELRO)
            .map(|(vaddr, size, _)| (vaddr, vaddr + size)),
        text: file
            .section_by_name(".text")
            .map(|s| (s.address(), s.address() + s.size())),
    })
}

/// The range of `ranges` (sorted, none overlapping) holding `pc`.
pub fn range_of(ranges: &[(u64, u64)], pc: u64) -> Option<(u64, u64)> {
    let k = ranges.partition_point(|r| r.0 <= pc);
    ranges[..k].last().copied().filter(|r| pc < r.1)
}

/// File-address ranges moved to where the program is loaded (`bias` added).
pub fn rebased(ranges: &[(u64, u64)], bias: u64) -> Vec<(u64, u64)> {
    ranges.iter().map(|(a, b)| (a + bias, b + bias)).collect()
}

/// The first program header of type `kind`: its address, memory size
/// and alignment (`object` lists only loadable segments).
fn program_header(data: &[u8], kind: object::elf::ProgramType) -> Option<(u64, u64, u64)> {
    use object::elf::FileHeader64;
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian as LE;
    let header = FileHeader64::<LE>::parse(data).ok()?;
    let headers = header.program_headers(LE, data).ok()?;
    headers
        .iter()
        .find(|ph| ph.p_type(LE) == kind)
        .map(|ph| (ph.p_vaddr(LE), ph.p_memsz(LE), ph.p_align(LE)))
}

/// The code ranges of `.eh_frame`'s FDEs (at `address`), sorted.
fn fde_ranges(address: u64, data: &[u8]) -> Vec<(u64, u64)> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
    let mut eh_frame = EhFrame::new(data, LittleEndian);
    eh_frame.set_address_size(8);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut ranges = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
                let start = fde.initial_address();
                ranges.push((start, start + fde.len()));
            }
        }
    }
    ranges.sort_unstable();
    ranges
}
