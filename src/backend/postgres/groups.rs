//! Grouped jobs on PostgreSQL: joining a group at enqueue, and combining
//! ready groups, each group's row locked (`SKIP LOCKED` by other nodes'
//! aggregators) for the whole combination.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::Queries;
use crate::backend::params::{bigint, Aggregated, EnqueueParams, GroupParams};
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// Inserts a job into its group: the member row, then the group's count and
/// policy.
pub(crate) fn join<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &EnqueueParams<'_>,
    g: &GroupParams<'_>,
) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    let max_attempts = i32::try_from(p.max_attempts).unwrap_or(i32::MAX);
    let max_size = i32::try_from(g.max_size).unwrap_or(i32::MAX);
    let row = one(
        tx,
        &q.join_group_member,
        &[
            &now,
            &p.queue,
            &p.kind,
            &g.key,
            &p.priority,
            &p.payload,
            &max_attempts,
        ],
    )?;
    tx.execute(
        &q.join_group,
        &[
            &now,
            &p.queue,
            &p.kind,
            &g.key,
            &max_size,
            &g.grace_us,
            &g.max_delay_us,
        ],
    )?;
    Ok(Enqueued {
        id: row.try_get(0)?,
        existed: false,
    })
}

/// Combines up to `limit` ready groups this node could lock, each into one
/// job due now; notifies the queue's listeners when it made any.
pub(crate) fn aggregate<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
    limit: usize,
) -> Result<Vec<Aggregated>> {
    let now = q.now_override(now);
    let limit = bigint(limit);
    let ready = tx.query(&q.ready_groups, &[&now, &limit])?;
    let mut done = Vec::with_capacity(ready.len());
    for group in &ready {
        let (queue, kind, key, max_size): (String, String, String, i32) = (
            group.try_get(0)?,
            group.try_get(1)?,
            group.try_get(2)?,
            group.try_get(3)?,
        );
        let members = tx.query(
            &q.group_members,
            &[&queue, &kind, &key, &i64::from(max_size)],
        )?;
        if let Some(first) = members.first() {
            let priority: i32 = first.try_get(1)?;
            let max_attempts: i32 = first.try_get(3)?;
            let ids: Vec<i64> = members
                .iter()
                .map(|m| m.try_get(0))
                .collect::<std::result::Result<_, _>>()?;
            let payloads: Vec<String> = members
                .iter()
                .map(|m| m.try_get(2))
                .collect::<std::result::Result<_, _>>()?;
            let payload = crate::group::combined_payload(payloads.iter().map(String::as_str));
            let row = one(
                tx,
                &q.enqueue,
                &[
                    &now,
                    &queue,
                    &kind,
                    &priority,
                    &Option::<&str>::None,
                    &payload,
                    &max_attempts,
                    &0_i64,
                ],
            )?;
            let job_id: i64 = row.try_get(0)?;
            tx.execute(&q.aggregate_to_history, &[&now, &ids, &job_id])?;
            super::counts::count_moved(tx, q, ids.iter().copied())?;
            done.push(Aggregated {
                job_id,
                queue: queue.clone(),
                kind: kind.clone(),
                members: ids.len(),
            });
        }
        let left = one(tx, &q.group_left, &[&queue, &kind, &key])?;
        let (count, oldest): (i64, Option<i64>) = (left.try_get(0)?, left.try_get(1)?);
        match oldest {
            Some(oldest) if count > 0 => {
                let count = i32::try_from(count).unwrap_or(i32::MAX);
                tx.execute(
                    &q.rearm_group,
                    &[&now, &queue, &kind, &key, &count, &oldest],
                )?;
            }
            _ => {
                tx.execute(&q.delete_group, &[&queue, &kind, &key])?;
            }
        }
    }
    if !done.is_empty() {
        tx.query(&q.notify, &[&q.channel])?;
    }
    Ok(done)
}

/// How long after now the next group is ready (0 when one is), in µs.
pub(crate) fn next_ready<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
) -> Result<Option<i64>> {
    let row = one(tx, &q.next_group_ready, &[&q.now_override(now)])?;
    let due: Option<i64> = row.try_get(0)?;
    Ok(due.map(|d| d.max(0)))
}

/// The one row a statement returns.
fn one<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<postgres::Row> {
    tx.query_opt(sql, params)?
        .ok_or_else(|| Error::Database("a statement returned no row".into()))
}
