//! The resource plan across the settings users run: budgets from 16 MiB to 64 GiB, records
//! of 1 B to 64 MiB, 1 to 10^10 of them in 1 to 10^6 files, open-file limits of 64 to 10^6
//! and both backends' limits. A plan never exceeds a limit it was given, never panics, and
//! where nothing fits it refuses with a reason.

use proptest::prelude::*;

use super::*;

/// Backends' limits.
fn backends() -> impl Strategy<Value = (usize, usize, usize)> {
    // io_uring's, the pread pool's (its thread cap bounds requests in flight), and a
    // backend of few slots (the old 4,096 clamp), where deep queues must be refused.
    prop_oneof![
        Just((32768, 1 << 20, 16384)),
        Just((128, 1 << 20, 0)),
        Just((4096, 4096, 4096))
    ]
}

prop_compose! {
    fn settings()(
        memory_log in (24u32..=36),
        record_log in (0u32..=26),
        records_log in (0u32..=33),
        files_log in (0u32..=20),
        nofile_log in (6u32..=20),
        depth in prop_oneof![Just(1usize), Just(8), Just(64), Just(256), Just(8192)],
        batch in prop_oneof![Just(1u64), Just(64), Just(256), Just(4096)],
        page in any::<bool>(),
        (max_in_flight, max_slots, max_registered_slots) in backends(),
        free_log in (20u32..=44),
    ) -> (Demand, Limits) {
        let records = 1u64 << records_log;
        let record = 1u64 << record_log;
        let bytes = records.saturating_mul(record);
        let files = (1u64 << files_log).min(records);
        let (grouping, units, units_bytes) = if page && record < 4096 {
            let units = (bytes / 4096).max(files).min(records);
            (Grouping::Page { unit: 4096 }, units, units * 8)
        } else {
            (Grouping::Record, records, 0)
        };
        let d = Demand {
            records,
            bytes,
            max_record: record,
            units,
            units_bytes,
            records_per_unit: records as f64 / units as f64,
            widest_unit: records.div_ceil(units),
            index_bytes: if record % 2 == 1 { records * 8 } else { 0 },
            view_bytes: 0,
            files,
            batch,
            prefetch: 4,
            depth,
            memory: Some(1u64 << memory_log),
            memory_from: MemoryFrom::Flag,
            grouping,
            runs: false,
            streamed: false,
        };
        let l = Limits {
            max_in_flight,
            max_slots,
            max_registered_slots,
            memlock: Some(8 << 20),
            open_files: 1u64 << nofile_log,
            scratch_free: Some(1u64 << free_log),
            scratch_inodes: Some(1 << 20),
            memory: None,
        };
        (d, l)
    }
}

/// Checks a plan against the limits it was given, or that its refusal says why.
fn holds(
    d: &Demand,
    l: &Limits,
    plan: Result<ResourcePlan>,
) -> std::result::Result<(), TestCaseError> {
    match plan {
        Ok(p) => {
            prop_assert!(
                p.memory_bytes <= d.memory.unwrap(),
                "memory {} > {:?}",
                p.memory_bytes,
                d.memory
            );
            prop_assert!(
                p.open_files <= l.open_files,
                "open files {} > {}",
                p.open_files,
                l.open_files
            );
            prop_assert!(p.scratch_bytes <= l.scratch_free.unwrap());
            let fig = |n: &str| p.figure(n).map_or(0, |f| f.value);
            prop_assert!(fig("queue_depth") <= l.max_slots as u64);
            prop_assert!(fig("io_slots") <= l.max_slots as u64);
            prop_assert!(fig("pile_load_slots") <= l.max_slots as u64);
            let memory: u64 = p
                .figures
                .iter()
                .filter(|f| f.kind == Kind::Memory)
                .map(|f| f.value)
                .sum();
            prop_assert_eq!(memory, p.memory_bytes);
            prop_assert!(p.figures.iter().all(|f| !f.reason.is_empty()));
        }
        Err(e) => {
            let why = e.to_string();
            prop_assert!(why.len() > 10, "a refusal without a reason: {why:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn lirs_plans_stay_within_their_limits((d, l) in settings()) {
        holds(&d, &l, lirs(&d, &l))?;
    }

    #[test]
    fn two_pass_plans_stay_within_their_limits((d, l) in settings()) {
        holds(&d, &l, two_pass(&d, &l))?;
    }
}

/// A million records of 1 KiB in one file (`streamed`: none, objects of a store) under a
/// budget of `memory`.
fn a_million_records(memory: u64, streamed: bool) -> Demand {
    Demand {
        records: 1_000_000,
        bytes: 1_000_000 * 1024,
        max_record: 1024,
        units: 1_000_000,
        units_bytes: 0,
        records_per_unit: 1.0,
        widest_unit: 1,
        index_bytes: 0,
        view_bytes: 0,
        files: if streamed { 0 } else { 1 },
        batch: 256,
        prefetch: 4,
        depth: 64,
        memory: Some(memory),
        memory_from: MemoryFrom::Flag,
        grouping: Grouping::Record,
        runs: false,
        streamed,
    }
}

/// Limits no plan of [`a_million_records`] meets.
fn roomy() -> Limits {
    Limits {
        max_in_flight: 32768,
        max_slots: 1 << 20,
        max_registered_slots: 16384,
        memlock: None,
        open_files: 1024,
        scratch_free: Some(1 << 40),
        scratch_inodes: Some(1 << 20),
        memory: None,
    }
}

#[test]
fn a_limit_the_plan_passes_is_refused_naming_it() {
    let d = a_million_records(1 << 30, false);
    let roomy = roomy();
    assert!(lirs(&d, &roomy).is_ok());
    let few = Limits {
        max_slots: 32,
        ..roomy
    };
    match lirs(&d, &few) {
        Err(Error::Exhausted {
            resource,
            asked: 64,
            limit: 32,
        }) => {
            assert!(resource.contains("slots"))
        }
        other => panic!("expected a refusal of 64 reads in flight, got {other:?}"),
    }
    let full = Limits {
        scratch_free: Some(1 << 20),
        ..roomy
    };
    match two_pass(&d, &full) {
        Err(Error::Exhausted { resource, .. }) => assert!(resource.contains("scratch")),
        other => panic!("expected a refusal for scratch space, got {other:?}"),
    }
}

/// A streamed scatter's reads are 4 MiB GETs where a quarter of the budget holds their
/// bodies, as a local scatter's reads; under a smaller budget GETs are whole huge pages,
/// or small enough not to be mapped on them, and their bodies take about a quarter of it.
#[test]
fn a_streamed_scatters_gets_take_a_quarter_of_the_budget_at_most() {
    let (d, limits) = (a_million_records, roomy());
    let scan = |memory, streamed| {
        let (_, plan, _) = two_pass_plan(&d(memory, streamed), &limits).unwrap();
        plan.scan_size
    };
    assert_eq!(scan(4 << 30, true), 4 << 20);
    assert_eq!(scan(1 << 30, true), 4 << 20);
    assert_eq!(scan(1 << 30, false), 4 << 20);
    assert_eq!(scan(192 << 20, true), 2 << 20);
    assert_eq!(scan(128 << 20, false), 2 << 20);
    assert_eq!(scan(32 << 20, true), 252 << 10);
    for m in [32u64 << 20, 100 << 20, 192 << 20, 1 << 30, 4 << 30] {
        let (_, plan, _) = two_pass_plan(&d(m, true), &limits).unwrap();
        let bodies = scan_bytes(plan.scan_size, true);
        assert!(bodies <= m / 2, "{m}: {bodies} of bodies");
    }
}

/// The plan counts the GETs a streamed read keeps in flight.
#[test]
fn the_plan_counts_the_gets_a_streamed_read_keeps_in_flight() {
    assert_eq!(super::piles::STREAMED_GETS, crate::dataset::GETS_IN_FLIGHT);
}
