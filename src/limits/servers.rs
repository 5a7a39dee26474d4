//! The servers' side of the limits: which queues have limits, as this
//! node last looked ([`LimitedQueues`]), and the lease that hands the
//! places a settling transaction freed on to its own claims without the
//! queue's row lock ([`lease_handing_on`]; see "Places handed on" in
//! [`crate::limits`]). SQLite's single writer needs neither.

use std::time::Duration;

use super::{LimitState, QueueLimits, WindowUpdate, LIMITS_SEEN_WITHIN};
use crate::error::Result;
use crate::lease::Job;
use crate::sync;

/// A look at the limited queues: when, and each with its limits.
type Look = (std::time::Instant, Vec<(String, QueueLimits)>);

/// The server backends' memory of which queues have limits, so a lease of
/// unlimited queues runs as before: one statement, no lock, no extra round
/// trip. Their plain lease statement skips every limited queue by itself, so
/// a limit set by another node is never exceeded while this memory is stale;
/// its queue is only not leased here until the next look, within
/// [`LimitedQueues::TTL`].
#[derive(Debug, Default)]
pub(crate) struct LimitedQueues {
    seen: std::sync::Mutex<Option<Look>>,
}

impl LimitedQueues {
    /// How long a look at the limited queues is trusted.
    pub(crate) const TTL: Duration = LIMITS_SEEN_WITHIN;

    /// True when a lease of `queues` capped per queue by `caps` may meet a
    /// limit, so takes the limited path (a transaction that locks the
    /// queue's row): it has a cap, or one of `queues` had a limit at the
    /// last look. `read` lists the limited queues when that look is older
    /// than [`Self::TTL`]. A queue limited since is skipped by the plain
    /// lease.
    pub(crate) fn may_limit(
        &self,
        queues: &[String],
        caps: &[(String, usize)],
        read: impl FnOnce() -> Result<Vec<(String, QueueLimits)>>,
    ) -> Result<bool> {
        if !caps.is_empty() {
            return Ok(true);
        }
        let mut seen = sync::lock(&self.seen);
        let fresh = seen
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < Self::TTL);
        if !fresh {
            *seen = Some((std::time::Instant::now(), read()?));
        }
        Ok(seen.as_ref().is_some_and(|(_, limited)| {
            queues
                .iter()
                .any(|q| limited.iter().any(|(name, _)| name == q))
        }))
    }

    /// The one queue of a lease of `queues` capped by `caps`, when it had a
    /// concurrency limit and no rate limit at the last look: such a lease
    /// may claim before it takes the queue's lock, and count under the lock
    /// afterwards (PostgreSQL's `limits::lease_ahead`). `None` for several
    /// queues (or one named twice), a cap, a rate limit, or no look yet.
    #[cfg(feature = "postgres")]
    pub(crate) fn by_concurrency_alone<'q>(
        &self,
        queues: &'q [String],
        caps: &[(String, usize)],
    ) -> Option<&'q str> {
        self.the_one_queue(queues, caps, |l| {
            l.concurrency.is_some() && l.rate.is_none()
        })
    }

    /// The one queue of a lease of `queues` capped by `caps`, when it had a
    /// rate limit at the last look (a concurrency limit or not): such a
    /// lease may claim before it takes the queue's lock, and count its
    /// starts in the rate window under the lock afterwards (PostgreSQL's
    /// `limits::lease_ahead_rated`). `None` as [`Self::by_concurrency_alone`]
    /// otherwise.
    #[cfg(feature = "postgres")]
    pub(crate) fn by_rate<'q>(
        &self,
        queues: &'q [String],
        caps: &[(String, usize)],
    ) -> Option<&'q str> {
        self.the_one_queue(queues, caps, |l| l.rate.is_some())
    }

    /// The one queue of a lease of `queues` with no cap, when its limits at
    /// the last look are `such`: `None` for several queues (or one named
    /// twice), a cap, other limits, or no look yet.
    #[cfg(feature = "postgres")]
    fn the_one_queue<'q>(
        &self,
        queues: &'q [String],
        caps: &[(String, usize)],
        such: impl Fn(&QueueLimits) -> bool,
    ) -> Option<&'q str> {
        let [first] = queues else {
            return None;
        };
        if !caps.is_empty() {
            return None;
        }
        let seen = sync::lock(&self.seen);
        let (_, limited) = seen.as_ref()?;
        limited
            .iter()
            .any(|(name, l)| name == first && such(l))
            .then_some(first.as_str())
    }

    /// The places that settles free, by queue, for a lease in the same
    /// transaction to hand on ([`lease_handing_on`]): one per item settled
    /// (`Ok`: its lease was held, and it ended) whose queue had a
    /// concurrency limit and no rate limit at the last look. `queues` holds
    /// each item's queue. A look that is stale only costs speed: the claim
    /// that hands a place on reads the queue's limits itself, and takes
    /// nothing when the queue has a rate limit by then (its starts must be
    /// counted under the queue's lock); a queue whose rate limit was lifted
    /// since takes the locked path until the next look.
    pub(crate) fn places_freed(
        &self,
        queues: &[&str],
        results: &[Result<bool>],
    ) -> Vec<(String, usize)> {
        let seen = sync::lock(&self.seen);
        let Some((_, limited)) = seen.as_ref() else {
            return Vec::new();
        };
        let mut freed: Vec<(String, usize)> = Vec::new();
        for (queue, result) in queues.iter().zip(results) {
            let by_places = limited
                .iter()
                .any(|(name, l)| name == queue && l.concurrency.is_some() && l.rate.is_none());
            if result.is_err() || !by_places {
                continue;
            }
            match freed.iter_mut().find(|(q, _)| q == queue) {
                Some((_, n)) => *n += 1,
                None => freed.push(((*queue).to_owned(), 1)),
            }
        }
        freed
    }

    /// Forgets the last look: this process just changed a limit.
    pub(crate) fn forget(&self) {
        *sync::lock(&self.seen) = None;
    }
}

/// A lease in the transaction that just settled jobs, on a server: each
/// queue of the lease named in `freed` is claimed first, up to the places
/// its settles freed (and the caller's cap), by `by_hand`, a claim that
/// takes no lock; the other queues then by `rest`, the usual lease (which
/// locks the limited ones' rows), with what is left of the limit.
///
/// A claim by hand cannot raise its queue's running count: the same
/// transaction ended at least as many of the queue's leases, and commits
/// both at once, so every other lease sees either both or neither. A lease
/// that counts the running jobs under the queue's lock meanwhile counts the
/// freed places as still taken, and admits no more than it would have. So
/// the row lock, which serializes every lease of the queue through its
/// commit, is paid only by claims that grow the queue's running count.
/// `by_hand` also stops at the room the queue's current limit leaves (a
/// lowered limit is honoured), and takes nothing from a queue that is
/// paused or has a rate limit (a start must be counted in its window).
///
/// A queue with places freed is not offered to `rest`: a worker that
/// wants more of it than it freed leases the difference on its own.
pub(crate) fn lease_handing_on<T: ?Sized>(
    tx: &mut T,
    p: &crate::backend::params::LeaseParams<'_>,
    freed: &[(String, usize)],
    by_hand: impl Fn(&mut T, &crate::backend::params::LeaseParams<'_>) -> Result<Vec<Job>>,
    rest: impl Fn(&mut T, &crate::backend::params::LeaseParams<'_>) -> Result<Vec<Job>>,
) -> Result<Vec<Job>> {
    use crate::backend::params::LeaseParams;
    let mut jobs = Vec::new();
    let mut others: Vec<String> = Vec::with_capacity(p.queues.len());
    let mut seen: Vec<&String> = Vec::with_capacity(p.queues.len());
    for q in p.queues {
        // A queue named twice is claimed once.
        if seen.contains(&q) {
            continue;
        }
        seen.push(q);
        let Some(places) = freed.iter().find(|(f, _)| f == q).map(|(_, n)| *n) else {
            others.push(q.clone());
            continue;
        };
        let cap = p
            .caps
            .iter()
            .find(|(c, _)| c == q)
            .map_or(usize::MAX, |(_, n)| *n);
        let limit = places.min(cap).min(p.limit - jobs.len());
        if limit > 0 {
            jobs.extend(by_hand(
                tx,
                &LeaseParams {
                    queues: std::slice::from_ref(q),
                    limit,
                    caps: &[],
                    ..*p
                },
            )?);
        }
    }
    if !others.is_empty() && jobs.len() < p.limit {
        jobs.extend(rest(
            tx,
            &LeaseParams {
                queues: &others,
                limit: p.limit - jobs.len(),
                ..*p
            },
        )?);
    }
    Job::sort_claimed(&mut jobs);
    Ok(jobs)
}

/// A server's lease over the limited queues whose rows it locked
/// (`limited`, at the server's `now`): the engine's [`lease_within`]
/// sees their rate limits and `p`'s caps, and each part's
/// `claim(queues, n, at, alone)` is told the limited queue it claims
/// alone, if any. `lease_within` claims each limited (or capped) queue in
/// a part of its own and the others together, so a part of one queue found
/// in `limited` is that queue's claim, which may count its own concurrency
/// room (the others' claims skip any queue limited meanwhile). Returns the
/// jobs in claim order and the rate windows to store.
///
/// [`lease_within`]: super::lease_within
pub(crate) fn lease_locked(
    p: &crate::backend::params::LeaseParams<'_>,
    limited: &[LimitState],
    now: i64,
    mut claim: impl FnMut(&[String], usize, i64, Option<&LimitState>) -> Result<Vec<Job>>,
) -> Result<(Vec<Job>, Vec<WindowUpdate>)> {
    let by_rate: Vec<LimitState> = limited.iter().map(LimitState::rate_only).collect();
    super::lease_within(p.queues, p.limit, &by_rate, p.caps, now, |queues, n, at| {
        claim(queues, n, at, claimed_alone(queues, limited))
    })
}

/// The limited queue that a part of [`lease_locked`] claims alone, if any.
fn claimed_alone<'a>(queues: &[String], limited: &'a [LimitState]) -> Option<&'a LimitState> {
    match queues {
        [one] => limited.iter().find(|s| &s.queue == one),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::limits::Rate;

    fn job(id: i64, queue: &str) -> Job {
        let at = std::time::UNIX_EPOCH;
        Job {
            id,
            lease_token: id,
            queue: queue.into(),
            kind: "k".into(),
            priority: 0,
            unique_key: None,
            payload: "null".into(),
            attempt: 1,
            max_attempts: 3,
            available_at: at,
            lease_until: at,
            created_at: at,
        }
    }

    /// Each claim made by hand or by the rest: its queues and limit.
    type Claims = Vec<(&'static str, Vec<String>, usize)>;

    fn hand_on(
        queues: &[&str],
        limit: usize,
        freed: &[(&str, usize)],
        caps: &[(String, usize)],
    ) -> Result<Claims> {
        let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
        let freed: Vec<(String, usize)> =
            freed.iter().map(|(q, n)| ((*q).to_owned(), *n)).collect();
        let p = crate::backend::params::LeaseParams {
            queues: &queues,
            kinds: None,
            limit,
            worker_id: "w",
            now: 0,
            lease_until: 1,
            caps,
        };
        // Every queue has plenty of jobs: a claim takes all it may.
        let claim = |claims: &mut Claims,
                     how: &'static str,
                     part: &crate::backend::params::LeaseParams<'_>| {
            claims.push((how, part.queues.to_vec(), part.limit));
            Ok((0..part.limit)
                .map(|i| job(i as i64, &part.queues[0]))
                .collect())
        };
        let mut claims = Claims::new();
        let jobs = lease_handing_on(
            &mut claims,
            &p,
            &freed,
            |c, part| claim(c, "hand", part),
            |c, part| claim(c, "rest", part),
        )?;
        assert!(jobs.len() <= limit);
        Ok(claims)
    }

    #[test]
    fn a_locked_lease_tells_each_part_the_limited_queue_it_claims_alone() -> Result<()> {
        let queues: Vec<String> = ["a", "b", "c"].iter().map(|q| (*q).to_owned()).collect();
        let caps = vec![("b".to_owned(), 5)];
        let p = crate::backend::params::LeaseParams {
            queues: &queues,
            kinds: None,
            limit: 10,
            worker_id: "w",
            now: 0,
            lease_until: 1,
            caps: &caps,
        };
        let limited = [LimitState {
            queue: "a".into(),
            limits: QueueLimits {
                concurrency: Some(2),
                rate: None,
            },
            window_start: None,
            window_count: 0,
            running: 0,
        }];
        // (queues, limit, the queue claimed alone): `a` is limited, `b` only
        // capped (no locked row), `c` neither.
        let mut parts: Vec<(Vec<String>, usize, Option<String>)> = Vec::new();
        lease_locked(&p, &limited, 0, |queues, n, _, alone| {
            parts.push((queues.to_vec(), n, alone.map(|s| s.queue.clone())));
            Ok(Vec::new())
        })?;
        let s = |q: &str| vec![q.to_owned()];
        assert_eq!(
            parts,
            vec![
                (s("a"), 10, Some("a".to_owned())),
                (s("b"), 5, None),
                (vec!["c".to_owned()], 10, None),
            ]
        );
        Ok(())
    }

    #[test]
    fn a_claim_by_hand_takes_no_more_places_than_its_transaction_freed() -> Result<()> {
        let s = |v: &[&str]| v.iter().map(|q| (*q).to_owned()).collect::<Vec<_>>();
        // Freed 2 of `a`, wants 10: 2 by hand, `a` not offered to the rest.
        assert_eq!(
            hand_on(&["a", "b"], 10, &[("a", 2)], &[])?,
            vec![("hand", s(&["a"]), 2), ("rest", s(&["b"]), 8)]
        );
        // The request's limit and the caller's cap bound it too.
        assert_eq!(
            hand_on(&["a"], 1, &[("a", 3)], &[])?,
            vec![("hand", s(&["a"]), 1)]
        );
        assert_eq!(
            hand_on(&["a", "b"], 10, &[("a", 3)], &[("a".into(), 1)])?,
            vec![("hand", s(&["a"]), 1), ("rest", s(&["b"]), 9)]
        );
        // Nothing freed: the usual lease, whole; a queue named twice once.
        assert_eq!(
            hand_on(&["a", "b", "a"], 5, &[], &[])?,
            vec![("rest", s(&["a", "b"]), 5)]
        );
        assert_eq!(
            hand_on(&["a", "a"], 5, &[("a", 2)], &[])?,
            vec![("hand", s(&["a"]), 2)]
        );
        Ok(())
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn only_a_lease_of_one_queue_limited_by_concurrency_alone_or_by_rate_may_claim_ahead(
    ) -> Result<()> {
        let known = LimitedQueues::default();
        let s = |v: &[&str]| v.iter().map(|q| (*q).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            known.by_concurrency_alone(&s(&["a"]), &[]),
            None,
            "no look yet"
        );
        known.may_limit(&s(&["a"]), &[], || {
            Ok(vec![
                (
                    "a".into(),
                    QueueLimits {
                        concurrency: Some(2),
                        rate: None,
                    },
                ),
                (
                    "r".into(),
                    QueueLimits {
                        concurrency: Some(2),
                        rate: Some(Rate::per_second(5)),
                    },
                ),
            ])
        })?;
        assert_eq!(known.by_concurrency_alone(&s(&["a"]), &[]), Some("a"));
        assert_eq!(known.by_concurrency_alone(&s(&["r"]), &[]), None);
        assert_eq!(known.by_rate(&s(&["r"]), &[]), Some("r"));
        assert_eq!(known.by_rate(&s(&["a"]), &[]), None);
        assert_eq!(known.by_rate(&s(&["r", "r"]), &[]), None);
        assert_eq!(known.by_rate(&s(&["r"]), &[("r".into(), 1)]), None);
        assert_eq!(known.by_concurrency_alone(&s(&["free"]), &[]), None);
        assert_eq!(known.by_concurrency_alone(&s(&["a", "a"]), &[]), None);
        assert_eq!(known.by_concurrency_alone(&s(&["a", "free"]), &[]), None);
        assert_eq!(
            known.by_concurrency_alone(&s(&["a"]), &[("a".into(), 1)]),
            None
        );
        Ok(())
    }

    #[test]
    fn only_settled_items_of_queues_limited_by_concurrency_alone_free_places() -> Result<()> {
        let known = LimitedQueues::default();
        let both = QueueLimits {
            concurrency: Some(2),
            rate: Some(Rate::per_second(5)),
        };
        known.may_limit(&["a".into()], &[], || {
            Ok(vec![
                (
                    "a".into(),
                    QueueLimits {
                        concurrency: Some(2),
                        rate: None,
                    },
                ),
                ("r".into(), both),
            ])
        })?;
        let lost = || Err(Error::LeaseLost { job_id: 1 });
        let freed = known.places_freed(
            &["a", "a", "a", "r", "free", "a"],
            &[Ok(false), lost(), Ok(true), Ok(false), Ok(false), Ok(false)],
        );
        assert_eq!(freed, vec![("a".to_owned(), 3)]);
        known.forget();
        assert!(known.places_freed(&["a"], &[Ok(false)]).is_empty());
        Ok(())
    }
}
