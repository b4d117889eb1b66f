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
//! system has available (`MemAvailable` and free swap).

use trapline_trace::ScanSkipReason;

/// A scan that does not fit: what it needs, what the tightest limit leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub reason: ScanSkipReason,
    pub needed: u64,
    pub available: u64,
    pub limit: u64,
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
    if let Some((available, limit)) = cgroup_room() {
        room.push((ScanSkipReason::CgroupMemory, available, limit));
    }
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") {
        // The mode is read only when the commit limit would matter.
        let strict = || {
            std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2")
        };
        room.extend(system_room(&meminfo, needed, strict));
    }
    if let Some(limit) = rlimit(libc::RLIMIT_AS) {
        // The agent's reserve is mapped already: what the kernel refuses
        // can still come from its unused tail.
        let reserve = crate::heap::reserve_unused() as u64;
        room.push((
            ScanSkipReason::AddressSpaceLimit,
            limit.saturating_sub(mapped).saturating_add(reserve),
            limit,
        ));
    }
    if let Some(limit) = rlimit(libc::RLIMIT_DATA) {
        let data = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| kib_field(&s, "VmData:"))
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
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let ok = unsafe { libc::getrlimit(resource, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The value of a `/proc` line "`name` N kB", in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Room under the system's limits, from `/proc/meminfo`: the commit limit
/// when it is short of `needed` and overcommit is off (`strict()`), and the
/// memory available.
fn system_room(
    meminfo: &str,
    needed: u64,
    strict: impl FnOnce() -> bool,
) -> Vec<(ScanSkipReason, u64, u64)> {
    let mut room = Vec::new();
    if let (Some(limit), Some(used)) = (
        kib_field(meminfo, "CommitLimit:"),
        kib_field(meminfo, "Committed_AS:"),
    ) {
        let left = limit.saturating_sub(used);
        if left < needed && strict() {
            room.push((ScanSkipReason::CommitLimit, left, limit));
        }
    }
    if let Some(available) = kib_field(meminfo, "MemAvailable:") {
        let swap = kib_field(meminfo, "SwapFree:").unwrap_or(0);
        let total = kib_field(meminfo, "MemTotal:").unwrap_or(0);
        room.push((
            ScanSkipReason::SystemMemory,
            available.saturating_add(swap),
            total,
        ));
    }
    room
}

/// Room under the memory cgroup's limit: (available, limit) of the
/// tightest level, `None` without a limit.
fn cgroup_room() -> Option<(u64, u64)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let read = |path: &str| std::fs::read_to_string(path).ok();
    cgroup_room_from(&groups, &mounts, &read)
}

/// `cgroup_room` over the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, reading the group's files with `read`.
fn cgroup_room_from(
    groups: &str,
    mounts: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut consider = |r: (u64, u64)| {
        if best.is_none_or(|b| r.0 < b.0) {
            best = Some(r);
        }
    };
    for line in groups.lines() {
        // "hierarchy-id:controllers:path"; v2's has no controllers.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            if let Some((point, dir)) = group_dir(mounts, path, |fs, _| fs == "cgroup2") {
                for r in v2_levels(&point, &dir, read) {
                    consider(r);
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = group_dir(mounts, path, |fs, opts| {
                fs == "cgroup" && opts.split(',').any(|o| o == "memory")
            });
            if let Some(r) = dir.and_then(|(_, d)| v1_room(&d, read)) {
                consider(r);
            }
        }
    }
    best
}

/// Where group `path` of the hierarchy whose mount `wanted(fstype, super
/// options)` accepts lies in the file system: (the mount point, the
/// group's directory below it).
fn group_dir(
    mounts: &str,
    path: &str,
    wanted: impl Fn(&str, &str) -> bool,
) -> Option<(String, String)> {
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|&f| f == "-") else {
            continue;
        };
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let (Some(fs), Some(opts)) = (fields.get(dash + 1), fields.get(dash + 3)) else {
            continue;
        };
        if !wanted(fs, opts) {
            continue;
        }
        let below = if *root == "/" {
            Some(path)
        } else {
            path.strip_prefix(root)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        if let Some(below) = below {
            let dir = format!("{point}{}", below.trim_end_matches('/'));
            return Some((point.to_string(), dir));
        }
    }
    None
}

/// A number in a cgroup file; `None` for "max" and for v1's "unlimited"
/// (a page-rounded `i64::MAX`).
fn limit_value(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&v| v < 1 << 60)
}

/// Page cache of a group that the kernel can drop before it kills: the
/// file pages on the LRU lists of its `memory.stat` (v1 names them with
/// `total_`, hierarchical).
fn reclaimable(stat: &str, prefix: &str) -> u64 {
    ["active_file", "inactive_file"]
        .iter()
        .filter_map(|k| {
            let key = format!("{prefix}{k} ");
            let line = stat.lines().find(|l| l.starts_with(&key))?;
            line[key.len()..].trim().parse::<u64>().ok()
        })
        .sum()
}

/// (available, limit) at every level of a v2 group that has a limit, from
/// the group `dir` up to the mount's root `point` (the root group has none).
fn v2_levels(point: &str, dir: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut dir = dir.to_string();
    while dir.len() > point.len() {
        if let Some(limit) = read(&format!("{dir}/memory.max")).and_then(|s| limit_value(&s)) {
            let current = read(&format!("{dir}/memory.current"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let cache = read(&format!("{dir}/memory.stat")).map_or(0, |s| reclaimable(&s, ""));
            out.push((limit.saturating_sub(current.saturating_sub(cache)), limit));
        }
        match dir.rfind('/') {
            Some(i) => dir.truncate(i),
            None => break,
        }
    }
    out
}

/// (available, limit) of a v1 memory group (`hierarchical_memory_limit`
/// is already the tightest of its ancestors').
fn v1_room(dir: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<(u64, u64)> {
    let stat = read(&format!("{dir}/memory.stat"))?;
    let limit = stat
        .lines()
        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
        .and_then(limit_value)?;
    let usage = read(&format!("{dir}/memory.usage_in_bytes"))?
        .trim()
        .parse::<u64>()
        .ok()?;
    let used = usage.saturating_sub(reclaimable(&stat, "total_"));
    Some((limit.saturating_sub(used), limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
";

    fn files(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = list
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |p| map.get(p).cloned()
    }

    #[test]
    fn a_v1_group_leaves_its_limit_less_what_it_uses_apart_from_file_cache() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/svc/memory.stat",
                "cache 1\nhierarchical_memory_limit 440401920\ntotal_active_file 4096\ntotal_inactive_file 8192\n",
            ),
            ("/sys/fs/cgroup/memory/svc/memory.usage_in_bytes", "300000000\n"),
        ]);
        let groups = "5:devices:/svc\n4:memory:/svc\n0::/svc\n";
        assert_eq!(
            cgroup_room_from(groups, MOUNTS, &read),
            Some((440_401_920 - (300_000_000 - 12_288), 440_401_920))
        );
        // v1's "no limit" is no limit.
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/svc/memory.stat",
                "hierarchical_memory_limit 9223372036854771712\n",
            ),
            ("/sys/fs/cgroup/memory/svc/memory.usage_in_bytes", "1\n"),
        ]);
        assert_eq!(cgroup_room_from(groups, MOUNTS, &read), None);
    }

    #[test]
    fn a_v2_group_is_bound_by_its_tightest_ancestor() {
        let read = files(&[
            ("/sys/fs/cgroup/unified/a/memory.max", "1000000\n"),
            ("/sys/fs/cgroup/unified/a/memory.current", "900000\n"),
            (
                "/sys/fs/cgroup/unified/a/memory.stat",
                "anon 1\nactive_file 100\ninactive_file 0\n",
            ),
            ("/sys/fs/cgroup/unified/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/unified/a/b/memory.current", "500000\n"),
        ]);
        assert_eq!(
            cgroup_room_from("0::/a/b\n", MOUNTS, &read),
            Some((100_100, 1_000_000))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_found_below_its_root() {
        let mounts = "50 1 0:40 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup rw\n";
        assert_eq!(
            group_dir(mounts, "/kubepods/pod1/ctr", |fs, _| fs == "cgroup2"),
            Some((
                "/sys/fs/cgroup".to_string(),
                "/sys/fs/cgroup/ctr".to_string()
            ))
        );
        assert_eq!(
            group_dir(mounts, "/kubepods/pod10", |fs, _| fs == "cgroup2"),
            None
        );
    }

    #[test]
    fn the_commit_limit_counts_only_without_overcommit() {
        let meminfo = "MemTotal: 1000 kB\nMemAvailable: 600 kB\nSwapFree: 100 kB\nCommitLimit: 800 kB\nCommitted_AS: 750 kB\n";
        let available = vec![(ScanSkipReason::SystemMemory, 700 * 1024, 1000 * 1024)];
        assert_eq!(system_room(meminfo, 51 * 1024, || false), available);
        // The mode is not asked for when the commit limit has room.
        assert_eq!(
            system_room(meminfo, 50 * 1024, || panic!("asked")),
            available
        );
        let strict = system_room(meminfo, 51 * 1024, || true);
        assert_eq!(
            tightest(51 * 1024, &strict),
            Err(Shortfall {
                reason: ScanSkipReason::CommitLimit,
                needed: 51 * 1024,
                available: 50 * 1024,
                limit: 800 * 1024,
            })
        );
        assert_eq!(tightest(50 * 1024, &available), Ok(()));
    }
}
