//! A team of threads that run one closure together: the caller plus
//! `threads - 1` workers of the team's own, meeting at spin barriers.
//!
//! A decode step of a small model is a few hundred products of tens of
//! microseconds each. Handing each one to a thread pool costs a wake-up
//! (a futex round trip, often more than the product) per product; a team
//! runs the whole step as one job instead, every member taking its share of
//! each product and waiting for the others at a barrier between products.
//!
//! Waiting spins briefly, then yields the core (so a loaded machine is not
//! made worse), and between jobs an idle worker parks on a condition
//! variable after about a millisecond. A panic in any member is caught, the
//! others leave their barriers, and [`Team::run`] reports it as an error.
//!
//! An *elastic* job ([`Team::run_elastic`]) has no barriers: its members
//! claim work and wait only for work to be *done* ([`Member::wait_for`]),
//! so on a loaded machine a member the scheduler took off its core holds
//! back nobody unless it holds a claim, and one that has not started when
//! the caller finished the job is left out of it (a barrier would wait for
//! every member to arrive, 150 times a decode step).
//!
//! A process forked after the team started has none of its threads: the
//! team's threads are kept per process ([`crate::per_process`]), so the first
//! job in a forked child starts a new set.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::per_process::PerProcess;
use crate::{CoreError, CoreResult};

/// Spins before a waiting member starts yielding its core.
const SPINS: u32 = 2_000;
/// How long an idle worker yields before it parks.
const IDLE: Duration = Duration::from_millis(1);
/// The gate's bit for an elastic job nobody may enter any more.
const CLOSED: u64 = 1 << 31;

/// What one member of a running job sees.
pub struct Member<'a> {
    /// This member's index, `0..threads` (0 is the caller).
    pub id: usize,
    /// Members in the team.
    pub threads: usize,
    shared: &'a Shared,
    elastic: bool,
}

impl Member<'_> {
    /// Wait until every member has reached this point. Writes made before
    /// the barrier are visible to every member after it.
    pub fn barrier(&self) {
        assert!(!self.elastic, "an elastic job has no barriers");
        let s = self.shared;
        if s.threads == 1 {
            return;
        }
        let gen = s.gen.load(Ordering::Acquire);
        if s.arrived.fetch_add(1, Ordering::AcqRel) + 1 == s.threads {
            s.arrived.store(0, Ordering::Relaxed);
            s.gen.store(gen.wrapping_add(1), Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while s.gen.load(Ordering::Acquire) == gen {
            if s.failed.load(Ordering::Relaxed) {
                // Another member panicked: leave by unwinding too (caught by run).
                std::panic::resume_unwind(Box::new("a team member failed"));
            }
            pause(&mut spins);
        }
    }

    /// Wait until `counter` reaches `target` (work others finished; their
    /// writes before a release add to it are visible after). Leaves by
    /// unwinding if another member failed.
    pub fn wait_for(&self, counter: &AtomicUsize, target: usize) {
        let mut spins = 0u32;
        while counter.load(Ordering::Acquire) < target {
            if self.shared.failed.load(Ordering::Relaxed) {
                std::panic::resume_unwind(Box::new("a team member failed"));
            }
            pause(&mut spins);
        }
    }

    /// The next unclaimed index of a work counter, or `None` past `n`.
    /// Every member must pass the same `counter` and `n`.
    pub fn claim(&self, counter: &AtomicUsize, n: usize) -> Option<usize> {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        (i < n).then_some(i)
    }
}

/// Spin a little, then yield the core.
#[inline]
fn pause(spins: &mut u32) {
    if *spins < SPINS {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

type Job = dyn Fn(&Member<'_>) + Sync;

/// The job being run, as a lifetime-erased pointer (valid while `run` waits).
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

struct Shared {
    threads: usize,
    /// Bumped by the caller to start a job (and to stop the workers).
    epoch: AtomicUsize,
    job: UnsafeCell<Option<JobPtr>>,
    /// The current job is elastic (written with `job`).
    elastic: AtomicBool,
    /// `epoch << 32 | CLOSED? | workers that entered` of the current job
    /// (a worker enters every job; only an elastic one closes).
    gate: AtomicU64,
    /// Workers that finished the current job.
    done: AtomicUsize,
    arrived: AtomicUsize,
    gen: AtomicUsize,
    failed: AtomicBool,
    quit: AtomicBool,
    parked: AtomicUsize,
    bell: Mutex<()>,
    ring: Condvar,
}

// SAFETY: `job` is written by the caller only while no worker reads it
// (before the epoch is bumped, with release order) and read by workers only
// after they see the new epoch (acquire); the job itself is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointer is only dereferenced while `run` waits.
unsafe impl Send for Shared {}

/// A team of `threads` members; see the module.
pub struct Team {
    threads: usize,
    crew: PerProcess<Crew>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads)
            .finish()
    }
}

impl Team {
    /// A team of `threads` members (the caller and `threads - 1` new threads).
    pub fn new(threads: usize) -> CoreResult<Self> {
        let threads = threads.max(1);
        Ok(Self {
            threads,
            crew: PerProcess::with(Crew::new(threads)?),
        })
    }

    /// Members in the team.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `job` on every member at once (the caller is member 0) and wait
    /// for all of them. A panic in any member is returned as an error.
    pub fn run<F: Fn(&Member<'_>) + Sync>(&self, job: F) -> CoreResult<()> {
        self.crew.get(|| Crew::new(self.threads))?.run(job, false)
    }

    /// Run `job` as an elastic job: the caller (member 0) and whichever
    /// workers start it before the caller finished its part; waits for those
    /// that started. The job must not use [`Member::barrier`] and must be
    /// complete when member 0 alone runs it (claims, [`Member::wait_for`]).
    pub fn run_elastic<F: Fn(&Member<'_>) + Sync>(&self, job: F) -> CoreResult<()> {
        self.crew.get(|| Crew::new(self.threads))?.run(job, true)
    }
}

/// The threads of a team in one process.
struct Crew {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time.
    lock: Mutex<()>,
}

impl Crew {
    fn new(threads: usize) -> CoreResult<Self> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            threads,
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            elastic: AtomicBool::new(false),
            gate: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            arrived: AtomicUsize::new(0),
            gen: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            bell: Mutex::new(()),
            ring: Condvar::new(),
        });
        let mut team = Self {
            shared: Arc::clone(&shared),
            workers: Vec::with_capacity(threads - 1),
            lock: Mutex::new(()),
        };
        for id in 1..threads {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("rlx-team-{id}"))
                .spawn(move || worker(&s, id))
                .map_err(|e| CoreError::option("threads", format!("cannot start a thread: {e}")))?;
            team.workers.push(handle);
        }
        Ok(team)
    }

    fn run<F: Fn(&Member<'_>) + Sync>(&self, job: F, elastic: bool) -> CoreResult<()> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.failed.store(false, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        s.arrived.store(0, Ordering::Relaxed);
        let erased: &(dyn Fn(&Member<'_>) + Sync + '_) = &job;
        // SAFETY: the pointer is only used until every worker has reported
        // `done` below, while `job` is alive; no worker reads `s.job` now
        // (they all finished the previous job and wait for a new epoch).
        unsafe {
            *s.job.get() = Some(JobPtr(std::mem::transmute::<
                &(dyn Fn(&Member<'_>) + Sync + '_),
                *const Job,
            >(erased)));
        }
        s.elastic.store(elastic, Ordering::Relaxed);
        let next = s.epoch.load(Ordering::Relaxed).wrapping_add(1);
        s.gate.store(gate_epoch(next), Ordering::Relaxed);
        s.epoch.store(next, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.bell.lock().unwrap_or_else(|e| e.into_inner());
            s.ring.notify_all();
        }
        let me = Member {
            id: 0,
            threads: s.threads,
            shared: s,
            elastic,
        };
        let mine = catch_unwind(AssertUnwindSafe(|| job(&me)));
        if mine.is_err() {
            s.failed.store(true, Ordering::Relaxed);
        }
        // Workers to wait for: all, or those that entered before the close.
        let expect = if elastic {
            (s.gate.fetch_or(CLOSED, Ordering::AcqRel) & (CLOSED - 1)) as usize
        } else {
            s.threads - 1
        };
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < expect {
            pause(&mut spins);
        }
        // SAFETY: every worker is done with the job.
        unsafe { *s.job.get() = None };
        if mine.is_err() || s.failed.load(Ordering::Relaxed) {
            return Err(CoreError::Internal(
                "a thread of the engine's team panicked".into(),
            ));
        }
        Ok(())
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.quit.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.bell.lock().unwrap_or_else(|e| e.into_inner());
            s.ring.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The gate of an open elastic job of epoch `epoch`.
fn gate_epoch(epoch: usize) -> u64 {
    (epoch as u64 & 0xffff_ffff) << 32
}

/// Enter the elastic job of epoch `epoch`, unless it closed or is over.
fn enter(s: &Shared, epoch: usize) -> bool {
    let mut g = s.gate.load(Ordering::Acquire);
    loop {
        if g & !0xffff_ffff != gate_epoch(epoch) || g & CLOSED != 0 {
            return false;
        }
        match s
            .gate
            .compare_exchange_weak(g, g + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => g = now,
        }
    }
}

fn worker(s: &Shared, id: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin, yield for a while, then park.
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let t0 = *since.get_or_insert_with(Instant::now);
            if t0.elapsed() < IDLE {
                std::thread::yield_now();
                continue;
            }
            let mut g = s.bell.lock().unwrap_or_else(|e| e.into_inner());
            s.parked.fetch_add(1, Ordering::SeqCst);
            while s.epoch.load(Ordering::SeqCst) == seen {
                g = s.ring.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.parked.fetch_sub(1, Ordering::SeqCst);
        }
        if s.quit.load(Ordering::SeqCst) {
            return;
        }
        if !enter(s, seen) {
            // An elastic job the caller finished without us, or one it has
            // moved on from: not ours.
            continue;
        }
        // Entered: the job of epoch `seen` stays until we report done.
        let elastic = s.elastic.load(Ordering::Relaxed);
        // SAFETY: the caller wrote the job before bumping the epoch we saw
        // and keeps it alive until we report done.
        let job = unsafe { *s.job.get() };
        if let Some(JobPtr(p)) = job {
            let me = Member {
                id,
                threads: s.threads,
                shared: s,
                elastic,
            };
            // SAFETY: see above.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*p)(&me) }));
            if r.is_err() {
                s.failed.store(true, Ordering::Relaxed);
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_runs_the_job_and_barriers_order_the_writes() {
        for threads in 1..=4 {
            let team = Team::new(threads).unwrap();
            for round in 0..50 {
                let slots: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                let sums: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                team.run(|m| {
                    slots[m.id].store(round + m.id + 1, Ordering::Relaxed);
                    m.barrier();
                    let total: usize = slots.iter().map(|s| s.load(Ordering::Relaxed)).sum();
                    sums[m.id].store(total, Ordering::Relaxed);
                    m.barrier();
                })
                .unwrap();
                let want: usize = (0..threads).map(|i| round + i + 1).sum();
                for s in &sums {
                    assert_eq!(s.load(Ordering::Relaxed), want);
                }
            }
        }
    }

    #[test]
    fn claims_hand_out_each_index_once() {
        let team = Team::new(3).unwrap();
        let counter = AtomicUsize::new(0);
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        team.run(|m| {
            while let Some(i) = m.claim(&counter, hits.len()) {
                hits[i].fetch_add(1, Ordering::Relaxed);
            }
        })
        .unwrap();
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_panicking_member_is_an_error_and_the_team_still_works() {
        let team = Team::new(2).unwrap();
        let err = team.run(|m| {
            if m.id == 1 {
                panic!("boom");
            }
            m.barrier();
        });
        assert!(err.is_err());
        let ran = AtomicUsize::new(0);
        team.run(|m| {
            m.barrier();
            ran.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_idle_team_parks_and_wakes() {
        let team = Team::new(2).unwrap();
        std::thread::sleep(IDLE * 5);
        let ran = AtomicUsize::new(0);
        team.run(|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn elastic_jobs_hand_out_each_claim_once_between_barrier_jobs() {
        // Alternating with barrier jobs: a worker left out of an elastic job
        // must not run a later job twice or out of step.
        for threads in 1..=3 {
            let team = Team::new(threads).unwrap();
            for round in 0..300 {
                let (counter, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
                let hits: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
                team.run_elastic(|m| {
                    let mut mine = 0;
                    while let Some(i) = m.claim(&counter, hits.len()) {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        mine += 1;
                    }
                    done.fetch_add(mine, Ordering::Release);
                    m.wait_for(&done, hits.len());
                })
                .unwrap();
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                if round % 3 == 0 {
                    let ran = AtomicUsize::new(0);
                    team.run(|m| {
                        m.barrier();
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap();
                    assert_eq!(ran.load(Ordering::Relaxed), threads);
                }
            }
        }
    }

    #[test]
    fn a_failing_member_of_an_elastic_job_releases_the_waiting_ones() {
        let team = Team::new(2).unwrap();
        let never = AtomicUsize::new(0);
        let err = team.run_elastic(|m| {
            if m.id == 0 {
                std::thread::sleep(Duration::from_millis(2));
                panic!("boom");
            }
            m.wait_for(&never, 1);
        });
        assert!(err.is_err());
        let ran = AtomicUsize::new(0);
        team.run_elastic(|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert!((1..=2).contains(&ran.load(Ordering::Relaxed)));
    }
}
