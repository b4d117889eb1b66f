//! The memory limits that can end a process, read from `/proc` and the
//! cgroup file system: its memory cgroup's (v1 and v2, every ancestor) and
//! the system's (available memory, the commit limit).
//!
//! Two users: the agent, which checks that a reachability scan fits before
//! it takes the memory (crates/agent/src/services/scan/headroom.rs), and `trapline
//! run`, which names the cgroup whose OOM killer ended a program. Plain
//! file reads and parsing; the parsers take the files' text, so that they
//! are tested without a cgroup.
#![forbid(unsafe_code)]

/// A memory cgroup: its directory, and which version of the interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Its directory in the cgroup file system.
    pub dir: String,
    /// The root of the hierarchy's mount (v2 walks up to it).
    pub mount: String,
    /// The path `/proc/self/cgroup` names it by.
    pub path: String,
    pub v2: bool,
}

/// Room under a limit: what it leaves, and the limit itself (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub available: u64,
    pub limit: u64,
}

/// Reads a file, `None` if it cannot be read.
fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

impl Group {
    /// The memory cgroup of this process (v1's memory hierarchy if there is
    /// one, else v2's), `None` when neither is mounted where it can be seen.
    pub fn of_this_process() -> Option<Group> {
        let groups = read("/proc/self/cgroup")?;
        let mounts = read("/proc/self/mountinfo")?;
        groups_of(&groups, &mounts).into_iter().next()
    }

    /// Room under the tightest limit of this group and, for v2, its
    /// ancestors; `None` without a limit.
    pub fn room(&self) -> Option<Room> {
        self.room_with(&read)
    }

    fn room_with(&self, read: &dyn Fn(&str) -> Option<String>) -> Option<Room> {
        if self.v2 {
            v2_levels(&self.mount, &self.dir, read)
                .into_iter()
                .min_by_key(|r| r.available)
        } else {
            v1_room(&self.dir, read)
        }
    }

    /// How many processes the group's OOM killer has ended (v2
    /// `memory.events`, v1 `memory.oom_control`, Linux 4.13).
    pub fn oom_kills(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        oom_kill_count(&read(&format!("{}/{file}", self.dir))?)
    }

    /// The tightest limit of the group (and v2's ancestors), if any.
    pub fn limit(&self) -> Option<u64> {
        self.room().map(|r| r.limit)
    }
}

/// How many processes the kernel's OOM killer has ended, system-wide
/// (`/proc/vmstat`, Linux 4.13; a memory cgroup's kills count too).
pub fn system_oom_kills() -> Option<u64> {
    oom_kill_count(&read("/proc/vmstat")?)
}

/// The value of the "oom_kill N" line of a kernel counter file.
fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

/// The memory groups `/proc/self/cgroup` names, v1's memory hierarchy first.
fn groups_of(groups: &str, mounts: &str) -> Vec<Group> {
    let mut v1 = Vec::new();
    let mut v2 = Vec::new();
    for line in groups.lines() {
        // "hierarchy-id:controllers:path"; v2's has no controllers.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            if let Some((mount, dir)) = group_dir(mounts, path, |fs, _| fs == "cgroup2") {
                v2.push(Group {
                    dir,
                    mount,
                    path: path.to_string(),
                    v2: true,
                });
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let found = group_dir(mounts, path, |fs, opts| {
                fs == "cgroup" && opts.split(',').any(|o| o == "memory")
            });
            if let Some((mount, dir)) = found {
                v1.push(Group {
                    dir,
                    mount,
                    path: path.to_string(),
                    v2: false,
                });
            }
        }
    }
    v1.into_iter().chain(v2).collect()
}

/// Room under the memory cgroup's limit: the tightest of this process's
/// groups (v1 and v2 may both be mounted), `None` without a limit.
pub fn cgroup_room() -> Option<Room> {
    let groups = read("/proc/self/cgroup")?;
    let mounts = read("/proc/self/mountinfo")?;
    cgroup_room_from(&groups, &mounts, &read)
}

fn cgroup_room_from(
    groups: &str,
    mounts: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<Room> {
    groups_of(groups, mounts)
        .iter()
        .filter_map(|g| g.room_with(read))
        .min_by_key(|r| r.available)
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

/// Room at every level of a v2 group that has a limit, from the group
/// `dir` up to the mount's root `mount` (the root group has none).
fn v2_levels(mount: &str, dir: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<Room> {
    let mut out = Vec::new();
    let mut dir = dir.to_string();
    while dir.len() > mount.len() {
        if let Some(limit) = read(&format!("{dir}/memory.max")).and_then(|s| limit_value(&s)) {
            let current = read(&format!("{dir}/memory.current"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let cache = read(&format!("{dir}/memory.stat")).map_or(0, |s| reclaimable(&s, ""));
            out.push(Room {
                available: limit.saturating_sub(current.saturating_sub(cache)),
                limit,
            });
        }
        match dir.rfind('/') {
            Some(i) => dir.truncate(i),
            None => break,
        }
    }
    out
}

/// Room in a v1 memory group (`hierarchical_memory_limit` is already the
/// tightest of its ancestors').
fn v1_room(dir: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<Room> {
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
    Some(Room {
        available: limit.saturating_sub(used),
        limit,
    })
}

/// The value of a `/proc` line "`name` N kB", in bytes.
pub fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The system's memory, from `/proc/meminfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemMemory {
    /// What can be had without swapping out: `MemAvailable` plus free swap.
    pub available: Room,
    /// Room under the commit limit (`CommitLimit` less `Committed_AS`),
    /// which binds only when `vm.overcommit_memory` is 2.
    pub commit: Option<Room>,
}

impl SystemMemory {
    /// Reads `/proc/meminfo`.
    pub fn read() -> Option<SystemMemory> {
        SystemMemory::parse(&read("/proc/meminfo")?)
    }

    fn parse(meminfo: &str) -> Option<SystemMemory> {
        let available = kib_field(meminfo, "MemAvailable:")?;
        let swap = kib_field(meminfo, "SwapFree:").unwrap_or(0);
        let total = kib_field(meminfo, "MemTotal:").unwrap_or(0);
        let commit = match (
            kib_field(meminfo, "CommitLimit:"),
            kib_field(meminfo, "Committed_AS:"),
        ) {
            (Some(limit), Some(used)) => Some(Room {
                available: limit.saturating_sub(used),
                limit,
            }),
            _ => None,
        };
        Some(SystemMemory {
            available: Room {
                available: available.saturating_add(swap),
                limit: total,
            },
            commit,
        })
    }
}

/// Whether the kernel refuses to overcommit (`vm.overcommit_memory` is 2):
/// then the commit limit binds.
pub fn overcommit_refused() -> bool {
    read("/proc/sys/vm/overcommit_memory").is_some_and(|s| s.trim() == "2")
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
            Some(Room {
                available: 440_401_920 - (300_000_000 - 12_288),
                limit: 440_401_920
            })
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
            Some(Room {
                available: 100_100,
                limit: 1_000_000
            })
        );
    }

    #[test]
    fn groups_are_found_v1_memory_first() {
        let groups = groups_of("5:devices:/svc\n4:memory:/svc\n0::/x\n", MOUNTS);
        let dirs: Vec<(&str, bool)> = groups.iter().map(|g| (g.dir.as_str(), g.v2)).collect();
        assert_eq!(
            dirs,
            [
                ("/sys/fs/cgroup/memory/svc", false),
                ("/sys/fs/cgroup/unified/x", true)
            ]
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
    fn meminfo_gives_the_available_memory_and_the_commit_room() {
        let meminfo = "MemTotal: 1000 kB\nMemAvailable: 600 kB\nSwapFree: 100 kB\nCommitLimit: 800 kB\nCommitted_AS: 750 kB\n";
        assert_eq!(
            SystemMemory::parse(meminfo),
            Some(SystemMemory {
                available: Room {
                    available: 700 * 1024,
                    limit: 1000 * 1024
                },
                commit: Some(Room {
                    available: 50 * 1024,
                    limit: 800 * 1024
                }),
            })
        );
        assert_eq!(SystemMemory::parse("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn oom_kills_are_read_from_the_kernel_counter_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(oom_kill_count(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v2), Some(2));
        assert_eq!(oom_kill_count("oom_kill_disable 0\n"), None);
    }
}
