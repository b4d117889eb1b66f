//! Whether a scan's memory fits under the limits that would end or fail the
//! program, checked before the scan takes it.
//!
//! A scan needs about 50 bytes per live block for a few hundred
//! milliseconds (`needed`). A service in a container near its memory limit
//! exited 0 natively and was killed by the OOM killer (status 137) in the
//! agent's exit scan; under `ulimit -v` or `vm.overcommit_memory=2` the
//! allocation would fail and abort the program. So the limits are read
//! first (about 50 microseconds of small files) and a scan that would pass
//! the tightest is skipped and recorded as skipped (`ScanSkipped`): at exit
//! the snapshot is then written unjudged, as with `--no-scan`.
//!
//! The limits: the memory cgroup's (v2 `memory.max` of the process's group
//! and every ancestor, v1 `hierarchical_memory_limit`), less what the group
//! uses apart from page cache the kernel can drop; the system's commit limit
//! when overcommit is off; `RLIMIT_AS` and `RLIMIT_DATA`; and the memory the
//! system has available (`MemAvailable` and free swap). The files are read
//! and parsed by the `trapline-memlimits` crate.

use trapline_memlimits as memlimits;
use trapline_trace::ScanSkipReason;

/// Why a scan cannot run: what it needs, and what the tightest limit leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub reason: ScanSkipReason,
    pub needed: u64,
    pub available: u64,
    pub limit: u64,
}

impl Shortfall {
    /// A reason that is no limit (memory unreadable, an allocation refused).
    pub fn without_limit(reason: ScanSkipReason, needed: u64) -> Shortfall {
        Shortfall {
            reason,
            needed,
            available: 0,
            limit: 0,
        }
    }
}

/// Bytes a scan of `blocks` live blocks takes at its peak, with room to
/// spare. Its parts: the sorted copy (16 bytes a block) and the radix
/// sort's scratch (16), then the granule table (8 reserved), the mark state
/// (1), the indirect bytes (8) and the mark stack (8 reserved, touched as
/// needed), and the copy of the mappings. Measured on 5 million live
/// blocks (`bench/README.md`, "Exit scan memory"), the process's peak grew
/// by 49 bytes a block; 50 are counted, an eighth more and 8 MiB for what
/// the live table gains before the copy and for the kernel's own pages.
pub fn needed(blocks: u64, mappings: usize) -> u64 {
    const PER_BLOCK: u64 = 50;
    let base = blocks
        .saturating_mul(PER_BLOCK)
        .saturating_add(mappings as u64 * 256);
    base.saturating_add(base / 8).saturating_add(8 << 20)
}

/// `Err` with the tightest limit when `needed` bytes do not fit; `mapped`
/// is the process's address space in use (its mappings' total).
pub fn check(needed: u64, mapped: u64) -> Result<(), Shortfall> {
    let mut room = Vec::with_capacity(5);
    if let Some(r) = memlimits::cgroup_room() {
        room.push((ScanSkipReason::CgroupMemory, r.available, r.limit));
    }
    if let Some(m) = memlimits::SystemMemory::read() {
        room.extend(system_room(m, needed, memlimits::overcommit_refused));
    }
    if let Some(limit) = rlimit(libc::RLIMIT_AS) {
        // The agent's reserve is mapped already: what the kernel refuses
        // can still come from its unused tail.
        let reserve = crate::platform::heap::reserve_unused() as u64;
        room.push((
            ScanSkipReason::AddressSpaceLimit,
            limit.saturating_sub(mapped).saturating_add(reserve),
            limit,
        ));
    }
    if let Some(limit) = rlimit(libc::RLIMIT_DATA) {
        let data = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| memlimits::kib_field(&s, "VmData:"))
            .unwrap_or(0);
        room.push((ScanSkipReason::DataLimit, limit.saturating_sub(data), limit));
    }
    tightest(needed, &room)
}

/// The shortfall of the tightest of `room` (reason, available, limit), if
/// `needed` does not fit in it.
fn tightest(needed: u64, room: &[(ScanSkipReason, u64, u64)]) -> Result<(), Shortfall> {
    match room.iter().min_by_key(|r| r.1) {
        Some(&(reason, available, limit)) if needed > available => Err(Shortfall {
            reason,
            needed,
            available,
            limit,
        }),
        _ => Ok(()),
    }
}

/// A resource limit in bytes (`None`: unlimited).
fn rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    crate::platform::sys::soft_limit(resource).filter(|&l| l != libc::RLIM_INFINITY)
}

/// Room under the system's limits: the memory available, and the commit
/// limit when it is short of `needed` and overcommit is off (`refused()`,
/// a file read only then).
fn system_room(
    m: memlimits::SystemMemory,
    needed: u64,
    refused: impl FnOnce() -> bool,
) -> Vec<(ScanSkipReason, u64, u64)> {
    let mut room = Vec::new();
    if let Some(c) = m.commit.filter(|c| c.available < needed) {
        if refused() {
            room.push((ScanSkipReason::CommitLimit, c.available, c.limit));
        }
    }
    room.push((
        ScanSkipReason::SystemMemory,
        m.available.available,
        m.available.limit,
    ));
    room
}

#[cfg(test)]
mod tests {
    use super::*;
    use memlimits::{Room, SystemMemory};

    #[test]
    fn the_commit_limit_counts_only_without_overcommit() {
        let m = SystemMemory {
            available: Room {
                available: 700,
                limit: 1000,
            },
            commit: Some(Room {
                available: 50,
                limit: 800,
            }),
        };
        let available = vec![(ScanSkipReason::SystemMemory, 700, 1000)];
        assert_eq!(system_room(m, 51, || false), available);
        // The mode is not asked for when the commit limit has room.
        assert_eq!(system_room(m, 50, || panic!("asked")), available);
        let strict = system_room(m, 51, || true);
        assert_eq!(
            tightest(51, &strict),
            Err(Shortfall {
                reason: ScanSkipReason::CommitLimit,
                needed: 51,
                available: 50,
                limit: 800,
            })
        );
        assert_eq!(tightest(50, &available), Ok(()));
    }
}
