//! The machine's memory budget for a run given no `--memory`: the least of what the
//! available RAM (a quarter of it), every memory cgroup above this process (v1 `memory.limit_in_bytes` or v2
//! `memory.max`, walked up to the hierarchy's root) and the address-space limit (`ulimit -v`)
//! leave, with the one that sets it named. A run in a 300 MB cgroup sized itself for 570 MB
//! and was OOM-killed; under `ulimit -v 300000` its slots could not be allocated.
//!
//! The parsing is pure (tested on real strings); [`here`] alone reads /proc and /sys.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// What set a memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryFrom {
    /// `--memory` (or a daemon's share of its own).
    Flag,
    /// A quarter of the available RAM (`MemAvailable` of /proc/meminfo): the rest is the
    /// trainer's, which shares the machine.
    Available,
    /// Three quarters of the smallest memory cgroup limit above this process.
    Cgroup,
    /// Half of what the address-space limit (`ulimit -v`) leaves.
    AddressSpace,
    /// Half of the available RAM: the default a resident read may hold the dataset in
    /// (the other half is the trainer's).
    AvailableHalf,
}

impl MemoryFrom {
    /// What sets the budget, in a few words.
    pub fn source(self) -> &'static str {
        match self {
            MemoryFrom::Flag => "--memory",
            MemoryFrom::Available => "a quarter of the available RAM",
            MemoryFrom::Cgroup => "3/4 of this process's memory cgroup limit",
            MemoryFrom::AddressSpace => "half of what ulimit -v leaves",
            MemoryFrom::AvailableHalf => "half of the available RAM",
        }
    }

    /// The budget of `bytes` as a message names it: `--memory 1000`, or the default
    /// budget, its size, what set it and what to do.
    pub fn words(self, bytes: u64) -> String {
        let todo = match self {
            MemoryFrom::Flag => return format!("--memory {bytes}"),
            MemoryFrom::AddressSpace => "give --memory to set one, or raise ulimit -v",
            _ => "give --memory to set one",
        };
        format!(
            "the default memory budget of {} ({}; {todo})",
            crate::size::human_bytes(bytes as f64),
            self.source()
        )
    }

    /// The resource an [`crate::Error::Exhausted`] names when a plan passes the budget.
    pub fn resource(self) -> &'static str {
        match self {
            MemoryFrom::Flag => "memory (--memory)",
            MemoryFrom::Available => "memory (the default budget: a quarter of the available RAM)",
            MemoryFrom::Cgroup => "memory (the default budget: 3/4 of the memory cgroup's limit)",
            MemoryFrom::AddressSpace => {
                "memory (the default budget: half of what ulimit -v leaves)"
            }
            MemoryFrom::AvailableHalf => {
                "memory (the default resident budget: half of the available RAM)"
            }
        }
    }
}

/// The memory a run given no `--memory` plans within, and what sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MachineMemory {
    /// The budget, bytes.
    pub bytes: u64,
    /// What sets it.
    pub from: MemoryFrom,
    /// The budget a resident read (the dataset held in memory across epochs) plans
    /// within when given no `--memory`: larger, since the memory is the point of that
    /// mode and it is taken only when the planner picks it ([`resident_budget`]).
    pub resident: u64,
    /// What sets `resident`.
    pub resident_from: MemoryFrom,
}

/// What the kernel says, as read: the inputs of [`budget`].
#[derive(Clone, Debug, Default)]
pub struct Readings {
    /// `MemAvailable`, bytes.
    pub available: Option<u64>,
    /// Each memory cgroup limit from this process's group up to the root (none: "max").
    pub cgroup_limits: Vec<Option<u64>>,
    /// RLIMIT_AS's soft limit (none: unlimited).
    pub address_space: Option<u64>,
    /// This process's address space now (`VmSize`), bytes.
    pub vm_size: u64,
}

/// Address space kept for what a run maps beside its budget: thread stacks, rings, the
/// allocator's arenas.
const MAP_RESERVE: u64 = 64 << 20;

/// The budget the readings leave: the least of a quarter of the available RAM, 3/4 of the smallest
/// cgroup limit, and half of the address space left after 64 MiB for mappings; `None` when
/// nothing is known.
pub fn budget(r: &Readings) -> Option<MachineMemory> {
    let cgroup = r.cgroup_limits.iter().flatten().min().copied();
    let candidates = [
        r.available.map(|a| (a / 4, MemoryFrom::Available)),
        cgroup.map(|c| (c / 4 * 3, MemoryFrom::Cgroup)),
        r.address_space.map(|a| {
            let left = a.saturating_sub(r.vm_size).saturating_sub(MAP_RESERVE);
            (left / 2, MemoryFrom::AddressSpace)
        }),
    ];
    let (resident, resident_from) = resident_budget(r)?;
    candidates
        .into_iter()
        .flatten()
        .min_by_key(|&(b, _)| b)
        .map(|(bytes, from)| MachineMemory {
            bytes,
            from,
            resident,
            resident_from,
        })
}

/// The default budget of a resident read: the least of half of the available RAM, 3/4 of
/// the smallest cgroup limit and half of the address space left (as [`budget`], with half
/// the RAM instead of a quarter); `None` when nothing is known.
pub fn resident_budget(r: &Readings) -> Option<(u64, MemoryFrom)> {
    let cgroup = r.cgroup_limits.iter().flatten().min().copied();
    [
        r.available.map(|a| (a / 2, MemoryFrom::AvailableHalf)),
        cgroup.map(|c| (c / 4 * 3, MemoryFrom::Cgroup)),
        r.address_space.map(|a| {
            let left = a.saturating_sub(r.vm_size).saturating_sub(MAP_RESERVE);
            (left / 2, MemoryFrom::AddressSpace)
        }),
    ]
    .into_iter()
    .flatten()
    .min_by_key(|&(b, _)| b)
}

/// A `kB` field of /proc/meminfo or /proc/self/status (`MemAvailable:  123 kB`), in bytes.
pub fn kb_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// A cgroup memory limit file's value: v2 `max`, or v1's "unlimited" (a page-rounded
/// 2^63 - 1), is no limit; unreadable text is none either.
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < 1 << 62)
}

/// The memory cgroup directories of this process, from /proc/self/mountinfo and
/// /proc/self/cgroup: for each hierarchy that has the memory controller (a v1 `memory`
/// mount, or the v2 one when no v1 mount takes it), its limit file and the directories from
/// this process's group up to the mount, innermost first.
pub fn limit_files(mountinfo: &str, proc_cgroup: &str) -> Vec<PathBuf> {
    use crate::emulate::cgroup::{member_dir, parse_mountinfo, parse_proc_cgroup};
    let mounts = parse_mountinfo(mountinfo);
    let groups = parse_proc_cgroup(proc_cgroup);
    let v1 = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == "memory"));
    let (mount, path, file) = match v1 {
        Some(m) => {
            let path = groups
                .iter()
                .find(|(_, c, _)| c.split(',').any(|c| c == "memory"))
                .map(|(_, _, p)| p.as_str());
            (m, path, "memory.limit_in_bytes")
        }
        None => match mounts.iter().find(|m| m.fstype == "cgroup2") {
            Some(m) => {
                let path = groups
                    .iter()
                    .find(|(id, c, _)| id == "0" && c.is_empty())
                    .map(|(_, _, p)| p.as_str());
                (m, path, "memory.max")
            }
            None => return Vec::new(),
        },
    };
    let Some(dir) = path.and_then(|p| member_dir(mount, p)) else {
        return Vec::new();
    };
    dir.ancestors()
        .take_while(|d| d.starts_with(&mount.point))
        .map(|d| d.join(file))
        .collect()
}

/// Reads a small kernel file (/proc, /sys: not a user's path), `None` when it cannot.
fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// This process's budget now, from the kernel (see [`budget`]).
pub fn here() -> Option<MachineMemory> {
    let proc = |p: &str| read(Path::new(p));
    let cgroup_limits = match (proc("/proc/self/mountinfo"), proc("/proc/self/cgroup")) {
        (Some(m), Some(c)) => limit_files(&m, &c)
            .iter()
            .map(|f| read(f).and_then(|t| parse_limit(&t)))
            .collect(),
        _ => Vec::new(),
    };
    let address_space = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&s| s != nix::sys::resource::RLIM_INFINITY);
    budget(&Readings {
        available: proc("/proc/meminfo").and_then(|t| kb_field(&t, "MemAvailable")),
        cgroup_limits,
        address_space,
        vm_size: proc("/proc/self/status")
            .and_then(|t| kb_field(&t, "VmSize"))
            .unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24608060 kB\nMemFree:         7522568 kB\n\
                           MemAvailable:   23710036 kB\nBuffers:          123456 kB\n";

    /// This machine's layout: cgroup v1 controllers and an empty v2 hierarchy beside them.
    const MOUNTINFO_V1: &str = "\
25 30 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 25 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 25 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP_V1: &str = "9:name=systemd:/\n4:memory:/process_api/75b5\n1:cpu:/\n0::/\n";

    const MOUNTINFO_V2: &str = "\
24 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
";
    const CGROUP_V2: &str = "0::/user.slice/user-0.slice/session-3.scope\n";

    #[test]
    fn meminfo_and_status_fields_parse_in_bytes() {
        assert_eq!(kb_field(MEMINFO, "MemAvailable"), Some(23_710_036 * 1024));
        assert_eq!(kb_field(MEMINFO, "MemTotal"), Some(24_608_060 * 1024));
        assert_eq!(kb_field(MEMINFO, "Mem"), None, "a prefix is not a field");
        let status = "Name:\triffle\nVmPeak:\t  370928 kB\nVmSize:\t  305380 kB\n";
        assert_eq!(kb_field(status, "VmSize"), Some(305_380 * 1024));
        assert_eq!(kb_field("MemAvailable: lots kB", "MemAvailable"), None);
    }

    #[test]
    fn cgroup_limit_values_parse_and_unlimited_is_none() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None, "v1's unlimited");
        assert_eq!(parse_limit("314572800\n"), Some(314_572_800));
        assert_eq!(parse_limit(""), None);
        assert_eq!(parse_limit("-1"), None);
    }

    #[test]
    fn limit_files_walk_from_the_group_up_to_the_mount() {
        let v1 = limit_files(MOUNTINFO_V1, CGROUP_V1);
        assert_eq!(
            v1,
            [
                "/sys/fs/cgroup/memory/process_api/75b5/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ]
            .map(PathBuf::from)
        );
        let v2 = limit_files(MOUNTINFO_V2, CGROUP_V2);
        assert_eq!(
            v2,
            [
                "/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope/memory.max",
                "/sys/fs/cgroup/user.slice/user-0.slice/memory.max",
                "/sys/fs/cgroup/user.slice/memory.max",
                "/sys/fs/cgroup/memory.max",
            ]
            .map(PathBuf::from)
        );
        assert!(limit_files("", CGROUP_V2).is_empty(), "no cgroup mounted");
    }

    #[test]
    fn the_smallest_limit_sets_the_budget_and_is_named() {
        let ram = Readings {
            available: Some(24 << 30),
            ..Readings::default()
        };
        assert_eq!(
            budget(&ram),
            Some(MachineMemory {
                bytes: 6 << 30,
                from: MemoryFrom::Available,
                resident: 12 << 30,
                resident_from: MemoryFrom::AvailableHalf,
            })
        );
        // A 300 MB group inside an unlimited one, inside a 1 GB one: the 300 MB one counts.
        let cgroup = Readings {
            cgroup_limits: vec![Some(300 << 20), None, Some(1 << 30)],
            ..ram.clone()
        };
        assert_eq!(
            budget(&cgroup),
            Some(MachineMemory {
                bytes: 225 << 20,
                from: MemoryFrom::Cgroup,
                resident: 225 << 20,
                resident_from: MemoryFrom::Cgroup,
            })
        );
        // ulimit -v 300000 with 20 MiB mapped already.
        let vm = Readings {
            address_space: Some(300_000 << 10),
            vm_size: 20 << 20,
            ..cgroup.clone()
        };
        let b = budget(&vm).unwrap();
        assert_eq!(b.from, MemoryFrom::AddressSpace);
        assert_eq!(b.bytes, ((300_000u64 << 10) - (20 << 20) - MAP_RESERVE) / 2);
        // An address space already spent leaves nothing, not an overflow.
        let spent = Readings {
            address_space: Some(10 << 20),
            vm_size: 20 << 20,
            ..Readings::default()
        };
        assert_eq!(budget(&spent).map(|b| b.bytes), Some(0));
        assert_eq!(budget(&Readings::default()), None);
    }
}
