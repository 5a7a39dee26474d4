//! Grouped jobs on SQLite: joining a group at enqueue, and combining ready
//! groups. Each runs inside a transaction its caller opened; the single
//! writer makes every step atomic.

use rusqlite::{params, Connection};

use super::queries;
use crate::backend::params::{bigint, Aggregated, EnqueueParams, GroupParams};
use crate::error::Result;
use crate::job::Enqueued;

/// Inserts a job into its group: an id from the jobs' sequence (a live row
/// inserted and moved out at once), the member row, and the group's count
/// and policy.
pub(crate) fn join(
    conn: &Connection,
    p: &EnqueueParams<'_>,
    g: &GroupParams<'_>,
) -> Result<Enqueued> {
    conn.prepare_cached(queries::ENQUEUE)?.execute(params![
        p.queue,
        p.kind,
        p.priority,
        Option::<&str>::None,
        p.payload,
        p.max_attempts,
        p.now,
        p.now
    ])?;
    let id = conn.last_insert_rowid();
    conn.prepare_cached(queries::JOIN_GROUP_MEMBER)?
        .execute(params![id, g.key])?;
    conn.prepare_cached(queries::DELETE_LIVE)?.execute([id])?;
    conn.prepare_cached(queries::JOIN_GROUP)?.execute(params![
        p.queue,
        p.kind,
        g.key,
        g.max_size,
        g.grace_us,
        g.max_delay_us,
        p.now
    ])?;
    Ok(Enqueued { id, existed: false })
}

/// Combines up to `limit` groups ready at `now`, each into one job due now.
pub(crate) fn aggregate(conn: &Connection, now: i64, limit: usize) -> Result<Vec<Aggregated>> {
    let limit = bigint(limit);
    let ready: Vec<(String, String, String, i64)> = conn
        .prepare_cached(queries::READY_GROUPS)?
        .query_map(params![now, limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut done = Vec::with_capacity(ready.len());
    for (queue, kind, key, max_size) in ready {
        let members: Vec<(i64, i32, String, u32)> = conn
            .prepare_cached(queries::GROUP_MEMBERS)?
            .query_map(params![queue, kind, key, max_size], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        if let Some(&(_, priority, _, max_attempts)) = members.first() {
            let last = members.last().map_or(0, |m| m.0);
            let payload = crate::group::combined_payload(members.iter().map(|m| m.2.as_str()));
            conn.prepare_cached(queries::ENQUEUE)?.execute(params![
                queue,
                kind,
                priority,
                Option::<&str>::None,
                payload,
                max_attempts,
                now,
                now
            ])?;
            let job_id = conn.last_insert_rowid();
            let group = params![queue, kind, key, last, now, job_id];
            conn.prepare_cached(queries::AGGREGATE_TO_HISTORY)?
                .execute(group)?;
            let ids: Vec<i64> = members.iter().map(|m| m.0).collect();
            super::counts::count_moved(conn, &ids)?;
            conn.prepare_cached(queries::DELETE_AGGREGATED)?
                .execute(params![queue, kind, key, last])?;
            done.push(Aggregated {
                job_id,
                queue: queue.clone(),
                kind: kind.clone(),
                members: members.len(),
            });
        }
        let (left, oldest): (i64, Option<i64>) = conn
            .prepare_cached(queries::GROUP_LEFT)?
            .query_row(params![queue, kind, key], |r| Ok((r.get(0)?, r.get(1)?)))?;
        match oldest {
            Some(oldest) if left > 0 => {
                conn.prepare_cached(queries::REARM_GROUP)?
                    .execute(params![queue, kind, key, left, oldest, now])?;
            }
            _ => {
                conn.prepare_cached(queries::DELETE_GROUP)?
                    .execute(params![queue, kind, key])?;
            }
        }
    }
    Ok(done)
}

/// How long after `now` the next group is ready (0 when one is), in µs.
pub(crate) fn next_ready(conn: &Connection, now: i64) -> Result<Option<i64>> {
    let at: Option<i64> = conn
        .prepare_cached(queries::NEXT_GROUP_READY)?
        .query_row([], |r| r.get(0))?;
    Ok(at.map(|at| at.saturating_sub(now).max(0)))
}
