//! Schema facts for repairing a name error. PostgreSQL says what is wrong (`column
//! oi.customer_id does not exist`, `missing FROM-clause entry for table "p"`); a small model
//! fixes such an error far more often when it is also told which table the alias stands for,
//! where the column really is, and how to join to it.

use crate::error::{SqlError, SqlState};
use crate::guard::{self, ColumnRef, GroupBy, Named, References, RelationRef, Select};
use crate::schema::{self, Hop};

/// The name a failed query got wrong, as read from PostgreSQL's message.
#[derive(Debug, PartialEq, Eq)]
enum NameError {
    /// `relation "x" does not exist`.
    UnknownRelation,
    /// `column [q.]x does not exist`.
    MissingColumn {
        qualifier: Option<String>,
        column: String,
    },
    /// `missing FROM-clause entry for table "q"`: `q.column` used, but nothing in FROM is `q`.
    MissingFromEntry {
        qualifier: String,
        column: Option<String>,
    },
}

impl NameError {
    fn read(sql: &str, error: &SqlError) -> Option<NameError> {
        match error.sqlstate {
            SqlState::UNDEFINED_COLUMN => {
                let (qualifier, column) = missing_column(&error.message)?;
                Some(NameError::MissingColumn { qualifier, column })
            }
            SqlState::UNDEFINED_TABLE => match error
                .message
                .strip_prefix("missing FROM-clause entry for table ")
            {
                Some(quoted) => {
                    let qualifier = quoted.trim_matches('"').to_string();
                    let column = error.position.and_then(|p| column_at(sql, p, &qualifier));
                    Some(NameError::MissingFromEntry { qualifier, column })
                }
                None => Some(NameError::UnknownRelation),
            },
            _ => None,
        }
    }
}

/// What the schema says that helps repair `error` of `sql`, when it is about a name.
pub fn for_error(sql: &str, error: &SqlError) -> Option<String> {
    let problem = NameError::read(sql, error)?;
    let refs = guard::references(sql);
    let mut lines = Vec::new();
    let column = match &problem {
        NameError::UnknownRelation => None,
        NameError::MissingColumn { qualifier, column } => {
            let at = error.position.and_then(|p| byte_offset(sql, p));
            if let Some(line) = qualifier
                .as_deref()
                .and_then(|q| lacking(&refs, q, column, at))
            {
                lines.push(line);
            }
            Some(column.as_str())
        }
        NameError::MissingFromEntry { qualifier, column } => {
            let used = column
                .as_ref()
                .map(|c| format!("{qualifier}.{c}"))
                .unwrap_or_else(|| qualifier.clone());
            lines.push(format!(
                "The query uses {used}, but no table in its FROM clause is named or aliased \
                 {qualifier}: add the table it means to FROM, joined through the foreign keys."
            ));
            column.as_deref()
        }
    };
    let names: Vec<String> = refs.relations.into_iter().map(|r| r.name).collect();
    let list_all = problem == NameError::UnknownRelation;
    lines.extend(schema::context().ok()?.describe(&names, column, list_all));
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A failed query rewritten so that a column its qualifier's relation lacks is qualified by
/// the relation of the query that has it, and what changed (`ae.drug_id → t.drug_id`).
#[derive(Debug, PartialEq, Eq)]
pub struct Requalified {
    pub sql: String,
    pub change: String,
}

/// When `error` says `q.c does not exist` and the schema says what was meant: `sql` with a
/// join condition `q.c = o.d` written the wrong way round swapped (o has c, q has d), or else
/// with the one other relation in reach that has a column `c` named wherever `q.c` is written.
/// Names are read where they are written, as PostgreSQL reads them: `q` is the relation of the
/// nearest SELECT (from the reported reference out) that names one so, only references to that
/// same relation move, and the relations in reach are those of that SELECT and the SELECTs
/// around it, a nearer name hiding a further one. Small models mix up aliases most of all, and
/// repeat the mix-up however the repair request names the right table. The other side of a
/// join condition `q.c` is in is never the one moved to (`a.c = q.c` would become `a.c =
/// a.c`): another relation that has `c` is, or else the relation between them that was skipped
/// is joined (`joined`). No move when the names are ambiguous (the column in two relations the
/// query does not join on it, a relation name in two schemas, a qualifier that is a
/// subquery's or a CTE's).
///
/// An unqualified column that no relation of the query has (`column "power_id" does not
/// exist`) is read from the one relation one foreign key away from the relations of its own
/// FROM clause that has it (or, when none has, two keys away), joined there (see
/// `joined_around`).
///
/// A column a GROUP BY query reads outside an aggregate (`column "c.name" must appear in the
/// GROUP BY clause`) is read through its relation's primary key when each group is already
/// one row of that relation (see `regrouped`).
pub fn requalify(sql: &str, error: &SqlError) -> Option<Requalified> {
    if error.sqlstate == SqlState::GROUPING_ERROR {
        let context = schema::context().ok()?;
        return regrouped(
            &guard::references(sql),
            sql,
            &error.message,
            byte_offset(sql, error.position?)?,
            // Each look-up reads the relations of the context: checked for a cancel.
            |schema: Option<&str>, name: &str| {
                pgrx::check_for_interrupts!();
                context.keys(schema, name)
            },
            |schema: Option<&str>, name: &str, column: &str| {
                pgrx::check_for_interrupts!();
                context.column_type(schema, name, column)
            },
        );
    }
    let Some(NameError::MissingColumn { qualifier, column }) = NameError::read(sql, error) else {
        return None;
    };
    let context = schema::context().ok()?;
    let schema = Schema {
        // A look-up reads the relations of the context by name: checked for a cancel too.
        has_column: |relation: &str, column: &str| {
            pgrx::check_for_interrupts!();
            context.has_column(relation, column)
        },
        // A look-up reads every relation of the context: a wide schema is a long loop.
        hops: |relation: &str, column: Option<&str>| {
            pgrx::check_for_interrupts!();
            context.hops(relation, column)
        },
    };
    let Some(qualifier) = qualifier else {
        let at = byte_offset(sql, error.position?)?;
        return joined_around(sql, &guard::references(sql), at, &column, &schema);
    };
    requalified(
        sql,
        &guard::references(sql),
        &qualifier,
        &column,
        error.position.and_then(|p| byte_offset(sql, p)),
        schema,
    )
}

/// What `requalified` asks of the schema: whether the one relation of a name has a column
/// (`None`: no such relation, or several), and the relations one foreign key away from it
/// (those that have a column, when one is named).
struct Schema<H, J> {
    has_column: H,
    hops: J,
}

impl<H, J> Schema<H, J>
where
    H: Fn(&str, &str) -> Option<bool>,
    J: Fn(&str, Option<&str>) -> Vec<Hop>,
{
    /// The shortest ways through foreign keys from the relation `from` to one that has
    /// `column`: each relation one key away that has it; when none has, each relation one key
    /// further through one that lacks it (a link table, most often), never back to `from` or
    /// to a relation named in `not_through` (the relations the query's FROM clause has
    /// already). At most `MAX_PATHS`: more than one is a guess anyway. `None` when the ways
    /// were not all looked at: each first step costs a look at every relation's keys, so a
    /// relation that very many others reference is not followed through them, and then no way
    /// may be called the only one (those not looked at could be as short).
    fn key_paths(&self, from: &str, column: &str, not_through: &[&str]) -> Option<Vec<Vec<Hop>>> {
        let direct: Vec<Vec<Hop>> = (self.hops)(from, Some(column))
            .into_iter()
            .map(|hop| vec![hop])
            .collect();
        if !direct.is_empty() {
            return Some(direct);
        }
        let mut paths = Vec::new();
        let firsts = (self.hops)(from, None);
        if firsts.len() > MAX_FIRST_HOPS {
            return None;
        }
        for first in firsts {
            if not_through.contains(&first.name.as_str()) {
                continue;
            }
            for second in (self.hops)(&first.name, Some(column)) {
                if second.name == from || not_through.contains(&second.name.as_str()) {
                    continue;
                }
                paths.push(vec![first.clone(), second]);
                if paths.len() > MAX_PATHS {
                    return Some(paths);
                }
            }
        }
        Some(paths)
    }
}

/// Ways to a column counted before `Schema::key_paths` stops: one is used, two are a guess.
const MAX_PATHS: usize = 2;
/// Relations one key away that `Schema::key_paths` goes on from, at most.
const MAX_FIRST_HOPS: usize = 100;

/// `requalify` once the names are read; `at`: where PostgreSQL says the reference is (else the
/// first one written is taken).
fn requalified<H, J>(
    sql: &str,
    refs: &References,
    qualifier: &str,
    column: &str,
    at: Option<usize>,
    schema: Schema<H, J>,
) -> Option<Requalified>
where
    H: Fn(&str, &str) -> Option<bool>,
    J: Fn(&str, Option<&str>) -> Vec<Hop>,
{
    let has_column = &schema.has_column;
    let named = |c: &ColumnRef| c.qualifier == qualifier && c.column == column;
    // The reference reported, and the FROM item its qualifier stands for where it is written.
    let reported = reported(refs, qualifier, column, at)?;
    let (home, item) = refs.relation_of(reported)?;
    if has_column(&item.name, column) != Some(false) {
        return None;
    }
    // Every reference to that column of that FROM item (a SELECT with its own relation of that
    // name keeps its references).
    let is_wrong = |c: &ColumnRef| named(c) && refs.qualifier_select(c) == Some(home);
    let has = |c: &ColumnRef, name: &str| {
        refs.relation_of(c)
            .and_then(|(_, r)| has_column(&r.name, name))
    };
    // The join conditions `q.c = o.d` the wrong column is in, as (it, the other side).
    let joins: Vec<(&ColumnRef, &ColumnRef)> = refs
        .equalities
        .iter()
        .filter_map(|[l, r]| match (is_wrong(l), is_wrong(r)) {
            (true, false) => Some((l, r)),
            (false, true) => Some((r, l)),
            _ => None,
        })
        .collect();
    // `q.c = o.d` where o has c and q has d: the join is written the wrong way round (which
    // side holds the foreign key), and swapping the qualifiers is the join meant.
    let swaps: Vec<&(&ColumnRef, &ColumnRef)> = joins
        .iter()
        .filter(|(wrong, other)| {
            other.qualifier != qualifier
                && wrong.select == other.select
                && has(other, column) == Some(true)
                && has_column(&item.name, &other.column) == Some(true)
        })
        .collect();
    if let [(wrong, other)] = swaps[..] {
        let sql = rewrite(
            sql,
            &[
                (wrong.at, qualifier, &other.qualifier),
                (other.at, &other.qualifier, qualifier),
            ],
        )?;
        let (o, d) = (&other.qualifier, &other.column);
        return Some(Requalified {
            sql,
            change: format!("{qualifier}.{column} = {o}.{d} → {o}.{column} = {qualifier}.{d}"),
        });
    }
    // The relations in reach of the reported reference (its SELECT's and those out from it; a
    // nearer qualifier hides a further one) that have the column, but not the other side of a
    // join condition the wrong column is in: moved there, `q.c = o.c` would compare o with
    // itself.
    let sides: Vec<(usize, &RelationRef)> = joins
        .iter()
        .filter_map(|(_, other)| refs.relation_of(other))
        .collect();
    let mut owners: Vec<(usize, &RelationRef)> = Vec::new();
    let mut hidden: Vec<&str> = Vec::new();
    let mut within = reported.select;
    // Each step goes one SELECT out; there are no more steps than SELECTs.
    for _ in 0..refs.selects.len() {
        let Some(index) = within else {
            break;
        };
        let select = refs.selects.get(index)?;
        for relation in &select.relations {
            let q = relation.qualifier();
            // Two of one name in one FROM clause: PostgreSQL refuses it; nothing to go by.
            if select
                .relations
                .iter()
                .filter(|r| r.qualifier() == q)
                .count()
                > 1
            {
                return None;
            }
            if hidden.contains(&q) {
                continue;
            }
            hidden.push(q);
            if has_column(&relation.name, column) == Some(true)
                && !sides.contains(&(index, relation))
            {
                owners.push((index, relation));
            }
        }
        if select.opaque {
            break;
        }
        within = select.parent;
    }
    // None (or only that other side): the relation between q and it was skipped.
    let Some(&(owner_select, owner)) = owners.first() else {
        return joined(sql, refs, home, item, column, &schema);
    };
    let qualifiers: Vec<String> = owners
        .iter()
        .map(|(_, r)| r.qualifier().to_string())
        .collect();
    if !equated(refs, &qualifiers, column) {
        return None;
    }
    // Each reference moves where the owner's qualifier stands for the owner.
    let mut edits: Vec<(usize, &str, &str)> = Vec::new();
    for c in refs.columns.iter().filter(|c| is_wrong(c)) {
        if refs.binding(c.select?, owner.qualifier()) != Some(owner_select) {
            return None;
        }
        edits.push((c.at, qualifier, owner.qualifier()));
    }
    Some(Requalified {
        sql: rewrite(sql, &edits)?,
        change: format!("{qualifier}.{column} → {}.{column}", owner.qualifier()),
    })
}

/// Whether `owners` (qualifiers) are one, or the query's equalities join all of them on
/// `column` (`t.c = d.c`, chained): then they hold the same value, and the first is as good as
/// any.
fn equated(refs: &References, owners: &[String], column: &str) -> bool {
    let Some(first) = owners.first() else {
        return false;
    };
    let mut joined = vec![first];
    // Each round joins at least one more owner, or ends.
    for _ in 1..owners.len() {
        let before = joined.len();
        for [l, r] in &refs.equalities {
            if l.column != column || r.column != column {
                continue;
            }
            for (a, b) in [(l, r), (r, l)] {
                if joined.contains(&&a.qualifier)
                    && !joined.contains(&&b.qualifier)
                    && owners.contains(&b.qualifier)
                {
                    joined.push(&b.qualifier);
                }
            }
        }
        if joined.len() == before {
            break;
        }
    }
    joined.len() == owners.len()
}

/// What follows the column in PostgreSQL's grouping error.
const UNGROUPED: &str = "\" must appear in the GROUP BY clause or be used in an aggregate function";

/// When `message` says the column `q.c` written at byte `at` must appear in the GROUP BY
/// clause, and each group of its SELECT is already one row of `q`'s table: `sql` with that
/// table's primary key added to the GROUP BY list, from which PostgreSQL reads `c` (a
/// functional dependency). A group is one row of `q` when a key of `q` (`SchemaContext::keys`:
/// its primary key, or a unique key of NOT NULL columns) is grouped: each key column is a
/// GROUP BY item, or is equal in every row (a WHERE or inner-join conjunct) to one, a column
/// of another relation of that SELECT of the very same type (`=` between two types compares
/// them as a third, which may equate values the key tells apart: text and citext, bigint and
/// float). That is the query a small model writes most (`GROUP BY o.customer_id` reading
/// `c.name` of the customer joined on it, which SQLite and MySQL accept); the groups, and so
/// the rows, stay what they were. A column that may vary within a group is left to the model:
/// no key chooses for it. `column_type` gives a column's type (`SchemaContext::column_type`).
fn regrouped<K, T>(
    refs: &References,
    sql: &str,
    message: &str,
    at: usize,
    keys: K,
    column_type: T,
) -> Option<Requalified>
where
    K: Fn(Option<&str>, &str) -> Option<schema::Keys>,
    T: Fn(Option<&str>, &str, &str) -> Option<Option<u32>>,
{
    let reported = message.strip_prefix("column \"")?.strip_suffix(UNGROUPED)?;
    let (home, qualifier, column) = match refs.columns.iter().find(|c| c.at == at) {
        Some(c) => (c.select?, c.qualifier.as_str(), c.column.as_str()),
        None => {
            let home = refs.select_at(at)?;
            let (column, _) = refs
                .selects
                .get(home)?
                .bare
                .iter()
                .find(|(_, b)| *b == at)?;
            let column = column.as_deref()?;
            let qualifier = reported.strip_suffix(column)?.strip_suffix('.')?;
            (home, qualifier, column)
        }
    };
    if reported != format!("{qualifier}.{column}") {
        return None;
    }
    let select = refs.selects.get(home)?;
    let group_by: &GroupBy = select.group_by.as_ref()?;
    let type_of = |r: &RelationRef, c: &str| column_type(r.schema.as_deref(), &r.name, c);
    // The relation of this SELECT a column written so is of, and the column's type.
    let resolve = |(q, c): &Named| -> Option<(&RelationRef, u32)> {
        let mut of = select.relations.iter().filter(|r| match q {
            Some(q) => r.qualifier() == q,
            None => type_of(r, c) != Some(None),
        });
        let relation = of.next()?;
        if of.next().is_some() || (q.is_none() && select.opaque) {
            return None;
        }
        Some((relation, type_of(relation, c)??))
    };
    let (relation, _) = resolve(&(Some(qualifier.to_string()), column.to_string()))?;
    let is_key = |name: &Named, key: &str| {
        name.1 == key && resolve(name).is_some_and(|(r, _)| std::ptr::eq(r, relation))
    };
    let in_group_by = |key: &str| group_by.columns.iter().any(|g| is_key(g, key));
    let equal_to_grouped = |key: &Named, other: &Named| {
        group_by.columns.contains(other)
            && resolve(key)
                .zip(resolve(other))
                .is_some_and(|((_, a), (_, b))| a == b)
    };
    let grouped = |key: &str| {
        in_group_by(key)
            || select.equated.iter().any(|[a, b]| {
                (is_key(a, key) && equal_to_grouped(a, b))
                    || (is_key(b, key) && equal_to_grouped(b, a))
            })
    };
    // The list's first item, written right after GROUP BY (not inside a parenthesis, which
    // would make the key part of a row value).
    let before = sql.get(..group_by.at)?.split_whitespace().last()?;
    if !["by", "distinct", "all"].contains(&before.to_ascii_lowercase().as_str()) {
        return None;
    }
    let keys = keys(relation.schema.as_deref(), &relation.name)?;
    let primary = keys.primary.as_ref()?;
    let one_row = keys
        .unique
        .iter()
        .chain([primary])
        .any(|key| key.iter().all(|k| grouped(k)));
    let added: Vec<String> = primary
        .iter()
        .filter(|k| !in_group_by(k))
        .map(|k| format!("{}.{}", identifier(qualifier), identifier(k)))
        .collect();
    if !one_row || added.is_empty() {
        return None;
    }
    let added = added.join(", ");
    Some(Requalified {
        sql: splice(sql, vec![(group_by.at, 0, format!("{added}, "))])?,
        change: format!("{qualifier}.{column} → GROUP BY {added}"),
    })
}

/// `sql` with each `(at, from, to)`: the qualifier written at byte `at`, which the parser folds
/// to `from`, written as `to`. `None` when there is nothing to do or a qualifier is not where
/// the parser said.
fn rewrite(sql: &str, edits: &[(usize, &str, &str)]) -> Option<String> {
    let splices = edits
        .iter()
        .map(|&(at, from, to)| Some((at, written_length(sql.get(at..)?, from)?, identifier(to))))
        .collect::<Option<Vec<_>>>()?;
    splice(sql, splices)
}

/// `sql` with each `(at, length, text)`: the `length` bytes at `at` replaced by `text`. `None`
/// when there is nothing to do or a range is not in `sql`.
fn splice(sql: &str, mut splices: Vec<(usize, usize, String)>) -> Option<String> {
    splices.sort_unstable_by_key(|&(at, _, _)| std::cmp::Reverse(at));
    splices.dedup_by_key(|&mut (at, _, _)| at);
    if splices.is_empty() {
        return None;
    }
    let mut rewritten = sql.to_string();
    for (at, length, text) in splices {
        sql.get(at..at.checked_add(length)?)?;
        rewritten.replace_range(at..at + length, &text);
    }
    Some(rewritten)
}

/// When the qualifier's relation lacks the column, no relation of the query can give it in its
/// place, and exactly one relation one foreign key away has it (the model skipped a table
/// between them), or else none does and exactly one two keys away has it: `sql` with that
/// relation (and the one between) joined right after the qualifier's FROM item, through the
/// keys, and the column read from it.
fn joined<H, J>(
    sql: &str,
    refs: &References,
    home: usize,
    item: &RelationRef,
    column: &str,
    schema: &Schema<H, J>,
) -> Option<Requalified>
where
    H: Fn(&str, &str) -> Option<bool>,
    J: Fn(&str, Option<&str>) -> Vec<Hop>,
{
    let qualifier = item.qualifier();
    let in_from = from_names(refs, home);
    let paths = schema.key_paths(&item.name, column, &in_from)?;
    let [path] = &paths[..] else {
        return None;
    };
    let (join, on) = join_after(sql, refs, home, item, path)?;
    let mut splices = kept_meanings(sql, refs, home, item, path, None, &schema.has_column)?;
    splices.push(join);
    // Only where the qualifier stands for that FROM item: a SELECT with its own relation of
    // that name keeps its reference (and its error).
    let h = identifier(&path.last()?.name);
    let mut moved = false;
    for c in refs.columns.iter() {
        if c.qualifier == qualifier && c.column == column && refs.qualifier_select(c) == Some(home)
        {
            splices.push((
                c.at,
                written_length(sql.get(c.at..)?, qualifier)?,
                h.clone(),
            ));
            moved = true;
        }
    }
    if !moved {
        return None;
    }
    Some(Requalified {
        sql: splice(sql, splices)?,
        change: format!("{qualifier}.{column} → {h}.{column}, joined by {on}"),
    })
}

/// When an unqualified column, written at byte `at`, is in no relation in reach and exactly one
/// relation one foreign key away from the relations of its own SELECT's FROM clause has it (the
/// model read it from the table beside the one that holds it, most often a link table), or else
/// none does and exactly one two keys away has it (through a link table the model skipped):
/// `sql` with that relation (and the one between) joined right after that FROM item, through
/// the keys. The column then resolves to it as written. Nothing when two relations of the FROM
/// clause, or two keys, or two ways of the same length lead to the column: which was meant is
/// the model's to say.
fn joined_around<H, J>(
    sql: &str,
    refs: &References,
    at: usize,
    column: &str,
    schema: &Schema<H, J>,
) -> Option<Requalified>
where
    H: Fn(&str, &str) -> Option<bool>,
    J: Fn(&str, Option<&str>) -> Vec<Hop>,
{
    let home = refs.select_at(at)?;
    let select = refs.selects.get(home)?;
    let in_from = from_names(refs, home);
    let mut found: Vec<(&RelationRef, Vec<Hop>)> = Vec::new();
    for item in &select.relations {
        // A FROM item whose ways were not all looked at could have one as short as any.
        let paths = schema.key_paths(&item.name, column, &in_from)?;
        found.extend(paths.into_iter().map(|path| (item, path)));
    }
    let shortest = found.iter().map(|(_, path)| path.len()).min()?;
    let mut shortest = found.iter().filter(|(_, path)| path.len() == shortest);
    let (item, path) = shortest.next()?;
    if shortest.next().is_some() {
        return None;
    }
    let (join, on) = join_after(sql, refs, home, item, path)?;
    let mut splices = kept_meanings(
        sql,
        refs,
        home,
        item,
        path,
        Some(column),
        &schema.has_column,
    )?;
    splices.push(join);
    Some(Requalified {
        sql: splice(sql, splices)?,
        change: format!(
            "{column} → {}.{column}, joined by {on}",
            identifier(&path.last()?.name)
        ),
    })
}

/// The names of the relations of SELECT `home`'s FROM clause.
fn from_names(refs: &References, home: usize) -> Vec<&str> {
    refs.selects
        .get(home)
        .map(|s| s.relations.iter().map(|r| r.name.as_str()).collect())
        .unwrap_or_default()
}

/// The splices that keep every other name of SELECT `home` meaning what it meant once the
/// relations `new` are joined into it after `item`: an unqualified column a new relation also has is qualified by
/// the one relation of the FROM clause that has it, and `*` by `item` when it is alone there.
/// `None` when that cannot be made sure of: such a name that no relation of the FROM clause has
/// (an outer query's column, or an output column's name, which the new relation would take
/// over) or two have, a FROM clause the schema does not know all of, `*` over several
/// relations; or such a name in a SELECT inside `home` that no FROM clause between them has
/// (the new relation would take it over there too). `missing`: the column the join is for,
/// which is meant to be the new relation's.
fn kept_meanings(
    sql: &str,
    refs: &References,
    home: usize,
    item: &RelationRef,
    new: &[Hop],
    missing: Option<&str>,
    has_column: impl Fn(&str, &str) -> Option<bool>,
) -> Option<Vec<(usize, usize, String)>> {
    let select = refs.selects.get(home)?;
    // Whether a new relation has the column `name` (`None`: not known).
    let new_has = |name: &str| -> Option<bool> {
        for relation in new {
            if has_column(&relation.name, name)? {
                return Some(true);
            }
        }
        Some(false)
    };
    let qualifier = |r: &RelationRef| identifier(r.qualifier());
    let mut splices = Vec::new();
    for (name, at) in &select.bare {
        let owner = match name.as_deref() {
            Some(name) if Some(name) == missing => continue,
            Some(name) => {
                if !new_has(name)? {
                    continue;
                }
                if select.opaque {
                    return None;
                }
                let mut owners = Vec::new();
                for relation in &select.relations {
                    if has_column(&relation.name, name)? {
                        owners.push(relation);
                    }
                }
                let [owner] = owners[..] else {
                    return None;
                };
                written_length(sql.get(*at..)?, name)?;
                owner
            }
            None if !select.opaque && select.relations.len() == 1 => item,
            None => return None,
        };
        splices.push((*at, 0, format!("{}.", qualifier(owner))));
    }
    // The SELECTs inside `home`: each of their names the new relation has must resolve before
    // it gets there.
    for (index, inner) in refs.selects.iter().enumerate() {
        let Some(path) = path_out(refs, index, home) else {
            continue;
        };
        for name in inner.bare.iter().filter_map(|(name, _)| name.as_deref()) {
            if Some(name) == missing || !new_has(name)? {
                continue;
            }
            let mut resolved = false;
            for select in &path {
                if select.opaque {
                    return None;
                }
                for relation in &select.relations {
                    resolved |= has_column(&relation.name, name)?;
                }
                if resolved {
                    break;
                }
            }
            if !resolved {
                return None;
            }
        }
    }
    Some(splices)
}

/// The SELECTs from `inner` out to `home`, `home` left out, when `inner` is inside `home`.
fn path_out(refs: &References, inner: usize, home: usize) -> Option<Vec<&Select>> {
    let mut path = Vec::new();
    let mut at = inner;
    // Each step goes one SELECT out; there are no more steps than SELECTs.
    for _ in 0..refs.selects.len() {
        if at == home {
            return (!path.is_empty()).then_some(path);
        }
        let select = refs.selects.get(at)?;
        path.push(select);
        at = select.parent?;
    }
    None
}

/// The splice that joins the relations of `path` right after the FROM item `item` of SELECT
/// `home`, each through its key to the one before, and the join conditions. The joins nest
/// there (`a JOIN b JOIN c ON .. ON ..` is `a JOIN (b JOIN c ON ..) ON ..`), so every clause
/// that could name the item can name the new relations too. `None` when a name of theirs would
/// change what a name means (`taken`), or the item is not where the parser said.
fn join_after(
    sql: &str,
    refs: &References,
    home: usize,
    item: &RelationRef,
    path: &[Hop],
) -> Option<((usize, usize, String), String)> {
    if path.is_empty() || path.iter().any(|hop| taken(refs, home, &hop.name)) {
        return None;
    }
    let end = item_end(sql, item.at?, item.alias.as_deref())?;
    let mut previous = identifier(item.qualifier());
    let (mut joins, mut conditions) = (String::new(), Vec::new());
    for hop in path {
        let h = identifier(&hop.name);
        let on: Vec<String> = hop
            .on
            .iter()
            .map(|(from, to)| format!("{h}.{} = {previous}.{}", identifier(to), identifier(from)))
            .collect();
        let on = on.join(" AND ");
        let named = if hop.sql == h {
            h.clone()
        } else {
            format!("{} AS {h}", hop.sql)
        };
        joins.push_str(&format!(" JOIN {named} ON {on}"));
        conditions.push(on);
        previous = h;
    }
    Some(((end, 0, joins), conditions.join(", then ")))
}

/// Whether a relation called `name`, joined into SELECT `home`, would take a name over, be
/// taken for another, or repeat one the model placed elsewhere on purpose: the FROM clause of
/// `home`, of a SELECT inside it or of one around it names a relation so (or aliases one so:
/// the model used that relation in a subquery, or correlated with it, and a second copy joined
/// here would lose that link); a reference `name.c` in `home` or a SELECT inside it stands for
/// a relation out from `home` (or for none the schema knows); or a common table expression is
/// called so (the join would read it instead of the table). A relation so named in a SELECT
/// neither inside nor around `home` (another branch of a UNION, a sibling subquery) is that
/// SELECT's own.
fn taken(refs: &References, home: usize, name: &str) -> bool {
    let inside = |select: usize| select == home || path_out(refs, select, home).is_some();
    let around = |select: usize| path_out(refs, home, select).is_some();
    let named_in_line = refs.selects.get(home).is_none()
        || refs.selects.iter().enumerate().any(|(i, s)| {
            (inside(i) || around(i))
                && s.relations
                    .iter()
                    .any(|r| r.name == name || r.qualifier() == name)
        });
    let outer_use = refs.columns.iter().any(|c| {
        c.qualifier == name
            && c.select.is_none_or(inside)
            && refs
                .qualifier_select(c)
                .is_none_or(|at| at == home || !inside(at))
    });
    named_in_line || outer_use || refs.ctes.iter().any(|c| c == name)
}

/// The byte offset right after the FROM item that starts at `at`: its (maybe qualified) name
/// and then, when it has one, its alias, with or without AS.
fn item_end(sql: &str, at: usize, alias: Option<&str>) -> Option<usize> {
    let mut end = at + leading_identifier(sql.get(at..)?)?.0;
    while sql.get(end..)?.starts_with('.') {
        end += 1 + leading_identifier(sql.get(end + 1..)?)?.0;
    }
    let Some(alias) = alias else {
        return Some(end);
    };
    let gap = |from: usize| -> Option<usize> {
        let rest = sql.get(from..)?;
        Some(rest.len() - rest.trim_start().len())
    };
    let mut at_alias = end + gap(end)?;
    let rest = sql.get(at_alias..)?;
    // By `get`: the model's alias may start with a character of several bytes.
    if rest.get(..2).is_some_and(|a| a.eq_ignore_ascii_case("as"))
        && rest
            .get(2..)
            .is_some_and(|r| r.starts_with(char::is_whitespace))
    {
        at_alias += 2 + gap(at_alias + 2)?;
    }
    Some(at_alias + written_length(sql.get(at_alias..)?, alias)?)
}

/// The length of the identifier `text` starts with, bare or quoted, and the name the parser
/// folds it to.
fn leading_identifier(text: &str) -> Option<(usize, String)> {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = quoted.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if chars.peek().is_some_and(|&(_, next)| next == '"') {
                    chars.next();
                    name.push('"');
                    continue;
                }
                return Some((i + 2, name));
            }
            name.push(c);
        }
        return None;
    }
    let length = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .unwrap_or(text.len());
    (length > 0).then(|| (length, text[..length].to_ascii_lowercase()))
}

/// The length of the identifier `text` starts with, when the parser folds it to `folded`.
fn written_length(text: &str, folded: &str) -> Option<usize> {
    let (length, name) = leading_identifier(text)?;
    (name == folded).then_some(length)
}

/// `name` as SQL writes it: bare when the parser would fold it to itself and read it as a
/// name (not a keyword it reserves: a table `order` or `user` is written `"order"`), else
/// quoted.
fn identifier(name: &str) -> String {
    let bare = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !RESERVED.contains(&name);
    if bare {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// The keywords PostgreSQL's grammar does not take as a table, alias or qualifier without
/// quotes (its reserved and type-or-function-name keywords, as of PostgreSQL 18).
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// The reference `qualifier.column` PostgreSQL reported at byte `at` (else the first one
/// written).
fn reported<'a>(
    refs: &'a References,
    qualifier: &str,
    column: &str,
    at: Option<usize>,
) -> Option<&'a ColumnRef> {
    refs.columns
        .iter()
        .filter(|c| c.qualifier == qualifier && c.column == column)
        .find(|c| at.is_none_or(|at| c.at == at))
}

/// `table (alias) has no column c.`: what the reported `qualifier.column` stands for where it
/// is written (a subquery may give the alias to another table than the outer query does).
fn lacking(refs: &References, qualifier: &str, column: &str, at: Option<usize>) -> Option<String> {
    let (_, relation) = refs.relation_of(reported(refs, qualifier, column, at)?)?;
    let alias = relation
        .alias
        .as_deref()
        .map(|a| format!(" ({a})"))
        .unwrap_or_default();
    Some(format!("{}{alias} has no column {column}.", relation.name))
}

/// The qualifier and column of PostgreSQL's `column "x" does not exist`, `column t.x does not
/// exist` or `column x of relation "t" does not exist`.
fn missing_column(message: &str) -> Option<(Option<String>, String)> {
    let rest = message.strip_prefix("column ")?;
    if let Some((column, relation)) = rest.split_once(" of relation ") {
        let relation = relation.strip_suffix(" does not exist")?.trim_matches('"');
        return Some((
            Some(relation.to_string()),
            column.trim_matches('"').to_string(),
        ));
    }
    let name = rest.strip_suffix(" does not exist")?;
    let (qualifier, column) = match name.rsplit_once('.') {
        Some((q, c)) if !name.starts_with('"') => (Some(q.to_string()), c),
        _ => (None, name),
    };
    let column = column.trim_matches('"');
    (!column.is_empty()).then(|| (qualifier, column.to_string()))
}

/// The byte offset in `sql` of PostgreSQL's 1-based character `position`.
fn byte_offset(sql: &str, position: i32) -> Option<usize> {
    let index = usize::try_from(position).ok()?.checked_sub(1)?;
    sql.char_indices().nth(index).map(|(at, _)| at)
}

/// The column of the reference `qualifier.column` that starts at PostgreSQL's 1-based
/// character `position` in `sql`, as the parser folds it.
fn column_at(sql: &str, position: i32, qualifier: &str) -> Option<String> {
    let start = usize::try_from(position).ok()?.checked_sub(1)?;
    let reference: String = sql.chars().skip(start).take(200).collect();
    let (written, rest) = reference.split_once('.')?;
    if !written.trim_matches('"').eq_ignore_ascii_case(qualifier) {
        return None;
    }
    let column = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?.to_string(),
        None => rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect::<String>()
            .to_lowercase(),
    };
    (!column.is_empty()).then_some(column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(sqlstate: &str, message: &str, position: Option<i32>) -> SqlError {
        SqlError {
            position,
            ..SqlError::new(SqlState::parse(sqlstate), message)
        }
    }

    #[test]
    fn the_missing_column_and_its_qualifier_are_read_from_the_message() {
        let read = |m: &str| NameError::read("", &error("42703", m, None));
        assert_eq!(
            read("column t2.power_name does not exist"),
            Some(NameError::MissingColumn {
                qualifier: Some("t2".into()),
                column: "power_name".into()
            })
        );
        assert_eq!(
            read("column \"hero_id\" does not exist"),
            Some(NameError::MissingColumn {
                qualifier: None,
                column: "hero_id".into()
            })
        );
        assert_eq!(
            read("column \"a.b\" does not exist"),
            Some(NameError::MissingColumn {
                qualifier: None,
                column: "a.b".into()
            })
        );
        assert_eq!(
            read("column nme of relation \"customers\" does not exist"),
            Some(NameError::MissingColumn {
                qualifier: Some("customers".into()),
                column: "nme".into()
            })
        );
        assert_eq!(read("operator does not exist: text = integer"), None);
    }

    #[test]
    fn a_missing_from_entry_is_read_with_the_column_at_the_error_position() {
        let sql = "SELECT c.name FROM customers c ORDER BY SUM(P.\"Price\" * 2), p.qty";
        let position = sql.find("P.").map(|p| p as i32 + 1);
        assert_eq!(
            NameError::read(
                sql,
                &error(
                    "42P01",
                    "missing FROM-clause entry for table \"p\"",
                    position
                )
            ),
            Some(NameError::MissingFromEntry {
                qualifier: "p".into(),
                column: Some("Price".into())
            })
        );
        let position = sql.find("p.qty").map(|p| p as i32 + 1);
        assert_eq!(
            column_at(sql, position.unwrap_or(0), "p").as_deref(),
            Some("qty")
        );
        assert_eq!(column_at(sql, 1, "p"), None, "the position is not at p.");
        assert_eq!(
            NameError::read(sql, &error("42P01", "relation \"x\" does not exist", None)),
            Some(NameError::UnknownRelation)
        );
    }

    /// The references of `sql` as the raw parser would report them, from a plain reading
    /// that is good enough for the queries below (`alias.column` tokens, `a.x = b.y`).
    fn read_refs(sql: &str, relations: &[(&str, Option<&str>)]) -> References {
        let token = |t: &str| {
            t.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '"'))
                .to_string()
        };
        let words: Vec<&str> = sql.split(' ').collect();
        // Each word's column reference, folded as the parser folds it.
        let mut at = 0;
        let mut by_word: Vec<Option<ColumnRef>> = Vec::new();
        for word in &words {
            let t = token(word);
            by_word.push(t.split_once('.').map(|(q, c)| ColumnRef {
                qualifier: match q.strip_prefix('"') {
                    Some(quoted) => quoted.trim_end_matches('"').to_string(),
                    None => q.to_lowercase(),
                },
                column: c.to_lowercase(),
                at: at + word.find(&t).unwrap_or(0),
                select: Some(0),
            }));
            at += word.len() + 1;
        }
        let equalities = (0..words.len().saturating_sub(2))
            .filter(|&i| words[i + 1] == "=")
            .filter_map(|i| Some([by_word[i].clone()?, by_word[i + 2].clone()?]))
            .collect();
        References {
            relations: relations
                .iter()
                .map(|(n, a)| RelationRef {
                    schema: None,
                    name: n.to_string(),
                    alias: a.map(str::to_string),
                    // Where the word is first written (the parser's offset of a FROM item).
                    at: sql
                        .split(' ')
                        .scan(0, |at, w| {
                            let start = *at;
                            *at += w.len() + 1;
                            Some((start, w))
                        })
                        .find(|(_, w)| w.eq_ignore_ascii_case(n))
                        .map(|(start, _)| start),
                })
                .collect(),
            columns: by_word.into_iter().flatten().collect(),
            equalities,
            ..References::default()
        }
        .in_one_select()
    }

    impl References {
        /// These references as one SELECT whose FROM clause has all the relations (no bare
        /// column references: `bare` adds them).
        fn in_one_select(mut self) -> Self {
            self.selects = vec![Select {
                parent: None,
                relations: self.relations.clone(),
                opaque: false,
                bare: Vec::new(),
                ..Select::default()
            }];
            self
        }
    }

    type Lookup = Schema<fn(&str, &str) -> Option<bool>, fn(&str, Option<&str>) -> Vec<Hop>>;

    fn no_hops(_: &str, _: Option<&str>) -> Vec<Hop> {
        Vec::new()
    }

    fn derm() -> Lookup {
        Schema {
            has_column: derm_columns,
            hops: no_hops,
        }
    }

    fn battles() -> Lookup {
        Schema {
            has_column: battles_columns,
            hops: no_hops,
        }
    }

    /// adverse_events(id, treatment_id), treatments(treatment_id, drug_id), drugs(drug_id, name).
    fn derm_columns(relation: &str, column: &str) -> Option<bool> {
        let columns: &[&str] = match relation {
            "adverse_events" => &["id", "treatment_id", "description"],
            "treatments" => &["treatment_id", "drug_id", "patient_id"],
            "drugs" => &["drug_id", "drug_name"],
            "patients" => &["patient_id", "name"],
            _ => return None,
        };
        Some(columns.contains(&column))
    }

    #[test]
    fn a_column_of_the_wrong_alias_moves_to_the_one_relation_that_has_it() {
        let sql = "SELECT ae.description, ae.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id WHERE ae.drug_id > 2";
        let refs = read_refs(
            sql,
            &[("adverse_events", Some("ae")), ("treatments", Some("t"))],
        );
        assert_eq!(
            requalified(sql, &refs, "ae", "drug_id", None, derm()),
            Some(Requalified {
                sql: "SELECT ae.description, t.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id WHERE t.drug_id > 2".into(),
                change: "ae.drug_id → t.drug_id".into(),
            })
        );
        // A quoted qualifier, as the parser keeps it; an unaliased owner, by its name.
        let sql =
            "SELECT \"AE\".drug_id FROM treatments JOIN adverse_events \"AE\" USING (treatment_id)";
        let refs = read_refs(sql, &[("treatments", None), ("adverse_events", Some("AE"))]);
        assert_eq!(
            requalified(sql, &refs, "AE", "drug_id", None, derm()).map(|r| r.sql).as_deref(),
            Some("SELECT treatments.drug_id FROM treatments JOIN adverse_events \"AE\" USING (treatment_id)")
        );
    }

    #[test]
    fn relations_joined_on_the_column_are_one_owner() {
        let relations = [
            ("adverse_events", Some("ae")),
            ("treatments", Some("t")),
            ("drugs", Some("d")),
        ];
        let sql = "SELECT ae.description, ae.drug_id, d.drug_name FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id JOIN drugs d ON d.drug_id = t.drug_id";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "ae", "drug_id", None, derm()),
            Some(Requalified {
                sql: "SELECT ae.description, t.drug_id, d.drug_name FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id JOIN drugs d ON d.drug_id = t.drug_id".into(),
                change: "ae.drug_id → t.drug_id".into(),
            })
        );
        // Joined on it to a relation that has it too, while another one has it: that other one
        // is the relation the join condition meant (the first would be compared with itself).
        let sql = "SELECT ae.description, ae.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id JOIN drugs d ON ae.drug_id = d.drug_id";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "ae", "drug_id", None, derm()),
            Some(Requalified {
                sql: "SELECT ae.description, t.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id JOIN drugs d ON t.drug_id = d.drug_id".into(),
                change: "ae.drug_id → t.drug_id".into(),
            })
        );
        // Joined on another column: which one is meant is a guess.
        let sql = "SELECT ae.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id JOIN drugs d ON d.drug_id = t.treatment_id";
        assert_eq!(
            requalified(
                sql,
                &read_refs(sql, &relations),
                "ae",
                "drug_id",
                None,
                derm()
            ),
            None
        );
    }

    /// courses(course_id, title), sections(section_id, course_id), enrollments(enrollment_id,
    /// section_id), with enrollments.section_id referencing sections.
    fn university() -> Lookup {
        fn columns(relation: &str, column: &str) -> Option<bool> {
            let columns: &[&str] = match relation {
                "courses" => &["course_id", "title"],
                "sections" => &["section_id", "course_id"],
                "enrollments" => &["enrollment_id", "section_id"],
                _ => return None,
            };
            Some(columns.contains(&column))
        }
        // enrollments.section_id references sections, sections.course_id courses.
        fn hops(relation: &str, column: Option<&str>) -> Vec<Hop> {
            let keys = [
                ("enrollments", "sections", "section_id"),
                ("sections", "courses", "course_id"),
            ];
            keys.iter()
                .flat_map(|&(a, b, key)| [(a, b, key), (b, a, key)])
                .filter(|&(from, to, _)| {
                    from == relation && column.is_none_or(|c| columns(to, c) == Some(true))
                })
                .map(|(_, to, key)| Hop {
                    sql: format!("uni.{to}"),
                    name: to.into(),
                    on: vec![(key.into(), key.into())],
                })
                .collect()
        }
        Schema {
            has_column: columns,
            hops,
        }
    }

    #[test]
    fn a_table_the_model_skipped_is_joined_through_its_foreign_key() {
        let relations = [("courses", Some("c")), ("enrollments", Some("e"))];
        let sql = "SELECT c.title, count(*) FROM courses c JOIN enrollments e ON c.course_id = e.course_id GROUP BY c.title";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "e", "course_id", None, university()),
            Some(Requalified {
                sql: "SELECT c.title, count(*) FROM courses c JOIN enrollments e JOIN uni.sections AS sections ON sections.section_id = e.section_id ON c.course_id = sections.course_id GROUP BY c.title".into(),
                change: "e.course_id → sections.course_id, joined by sections.section_id = e.section_id".into(),
            })
        );
        // No relation of the query has it; an alias written with AS.
        let relations = [("enrollments", Some("e"))];
        let sql = "SELECT E.enrollment_id FROM enrollments AS E WHERE E.course_id = 3";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "e", "course_id", None, university())
                .map(|r| r.sql)
                .as_deref(),
            Some("SELECT E.enrollment_id FROM enrollments AS E JOIN uni.sections AS sections ON sections.section_id = e.section_id WHERE sections.course_id = 3")
        );
        // The query uses the name sections already (for courses, here): never a second one.
        let relations = [("enrollments", Some("e")), ("courses", Some("sections"))];
        let sql =
            "SELECT 1 FROM enrollments e JOIN courses sections ON sections.course_id = e.course_id";
        assert_eq!(
            requalified(
                sql,
                &read_refs(sql, &relations),
                "e",
                "course_id",
                None,
                university()
            ),
            None
        );
        // Two relations a key away have it, or none: a guess.
        let two = Schema {
            has_column: university().has_column,
            hops: |relation: &str, column: Option<&str>| {
                let mut hops = (university().hops)(relation, column);
                hops.extend(hops.clone());
                hops
            },
        };
        let relations = [("enrollments", Some("e"))];
        let sql = "SELECT e.course_id FROM enrollments e";
        assert_eq!(
            requalified(
                sql,
                &read_refs(sql, &relations),
                "e",
                "course_id",
                None,
                two
            ),
            None
        );
        // Nothing a key away has it, one relation two keys away has: both are joined.
        let sql = "SELECT e.title FROM enrollments e";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "e", "title", None, university()),
            Some(Requalified {
                sql: "SELECT courses.title FROM enrollments e JOIN uni.sections AS sections ON sections.section_id = e.section_id JOIN uni.courses AS courses ON courses.course_id = sections.course_id".into(),
                change: "e.title → courses.title, joined by sections.section_id = e.section_id, then courses.course_id = sections.course_id".into(),
            })
        );
    }

    #[test]
    fn an_unqualified_column_two_keys_away_is_read_through_the_relation_between() {
        let one = [("enrollments", None)];
        // Through sections, whose section_id the query also names: that stays enrollments'.
        let sql = "SELECT section_id FROM enrollments WHERE title = 'Databases'";
        assert_eq!(
            around(sql, &one, &["section_id", "title"], "title", university()),
            Some(Requalified {
                sql: "SELECT enrollments.section_id FROM enrollments JOIN uni.sections AS sections ON sections.section_id = enrollments.section_id JOIN uni.courses AS courses ON courses.course_id = sections.course_id WHERE title = 'Databases'".into(),
                change: "title → courses.title, joined by sections.section_id = enrollments.section_id, then courses.course_id = sections.course_id".into(),
            })
        );
        // Nothing two keys away has it.
        let sql = "SELECT 1 FROM enrollments WHERE budget = 3";
        assert_eq!(around(sql, &one, &["budget"], "budget", university()), None);
        // Two ways two keys long: a guess.
        let two_ways: Lookup = Schema {
            has_column: university().has_column,
            hops: |r: &str, c: Option<&str>| {
                let mut found = (university().hops)(r, c);
                if r == "sections" {
                    found.extend(found.clone());
                }
                found
            },
        };
        let sql = "SELECT 1 FROM enrollments WHERE title = 'x'";
        assert_eq!(around(sql, &one, &["title"], "title", two_ways), None);
        // More relations one key away than are followed: the one way found among those looked
        // at is not taken for the only one.
        let hub: Lookup = Schema {
            has_column: university().has_column,
            hops: |r: &str, c: Option<&str>| {
                let mut found = (university().hops)(r, c);
                if r == "enrollments" && c.is_none() {
                    let dead_end = Hop {
                        sql: "uni.audits".into(),
                        name: "audits".into(),
                        on: vec![("student_id".into(), "student_id".into())],
                    };
                    found.extend(std::iter::repeat_n(dead_end, 100));
                }
                found
            },
        };
        let sql = "SELECT 1 FROM enrollments WHERE title = 'x'";
        assert_eq!(around(sql, &one, &["title"], "title", hub), None);
        // The relation between is in the FROM clause already: that is one key away, not two.
        let sql = "SELECT 1 FROM enrollments, sections WHERE title = 'x'";
        let both = [("enrollments", None), ("sections", None)];
        assert_eq!(
            around(sql, &both, &["title"], "title", university()).map(|r| r.sql).as_deref(),
            Some("SELECT 1 FROM enrollments, sections JOIN uni.courses AS courses ON courses.course_id = sections.course_id WHERE title = 'x'")
        );
    }

    /// `read_refs`, with the words of `bare` (or `*`) as the SELECT's unqualified column
    /// references, where they are written.
    fn with_bare(sql: &str, relations: &[(&str, Option<&str>)], bare: &[&str]) -> References {
        let mut refs = read_refs(sql, relations);
        refs.selects[0].bare = sql
            .split(' ')
            .scan(0, |at, w| {
                let start = *at;
                *at += w.len() + 1;
                Some((start, w.trim_end_matches(',')))
            })
            .filter(|(_, w)| bare.contains(w))
            .map(|(at, w)| ((w != "*").then(|| w.to_string()), at))
            .collect();
        refs
    }

    /// `joined_around` for the first unqualified `column` of `sql`.
    fn around(
        sql: &str,
        relations: &[(&str, Option<&str>)],
        bare: &[&str],
        column: &str,
        schema: Lookup,
    ) -> Option<Requalified> {
        let refs = with_bare(sql, relations, bare);
        let at = refs.selects[0]
            .bare
            .iter()
            .find(|(name, _)| name.as_deref() == Some(column))?
            .1;
        joined_around(sql, &refs, at, column, &schema)
    }

    #[test]
    fn an_unqualified_column_no_relation_has_is_read_from_the_one_a_key_away() {
        let sql = "SELECT enrollment_id FROM enrollments WHERE course_id = 3";
        let relations = [("enrollments", None)];
        let bare = ["enrollment_id", "course_id"];
        assert_eq!(
            around(sql, &relations, &bare, "course_id", university()),
            Some(Requalified {
                sql: "SELECT enrollment_id FROM enrollments JOIN uni.sections AS sections ON sections.section_id = enrollments.section_id WHERE course_id = 3".into(),
                change: "course_id → sections.course_id, joined by sections.section_id = enrollments.section_id".into(),
            })
        );
        // After an alias; the other relations of the FROM clause lead nowhere.
        let sql = "SELECT count(*) FROM students s, enrollments AS e WHERE course_id = 3";
        assert_eq!(
            around(sql, &[("students", Some("s")), ("enrollments", Some("e"))], &["course_id"], "course_id", university()).map(|r| r.sql).as_deref(),
            Some("SELECT count(*) FROM students s, enrollments AS e JOIN uni.sections AS sections ON sections.section_id = e.section_id WHERE course_id = 3")
        );
        // Names the new relation shares with the FROM clause keep their relation; so does `*`.
        let sql = "SELECT section_id, count(*) FROM enrollments e WHERE course_id = 3 GROUP BY section_id";
        assert_eq!(
            around(sql, &[("enrollments", Some("e"))], &["section_id", "course_id"], "course_id", university()).map(|r| r.sql).as_deref(),
            Some("SELECT e.section_id, count(*) FROM enrollments e JOIN uni.sections AS sections ON sections.section_id = e.section_id WHERE course_id = 3 GROUP BY e.section_id")
        );
        let sql = "SELECT * FROM enrollments WHERE course_id = 3";
        assert_eq!(
            around(sql, &[("enrollments", None)], &["*", "course_id"], "course_id", university()).map(|r| r.sql).as_deref(),
            Some("SELECT enrollments.* FROM enrollments JOIN uni.sections AS sections ON sections.section_id = enrollments.section_id WHERE course_id = 3")
        );
    }

    #[test]
    fn a_relation_joined_for_a_qualified_column_leaves_the_other_names_as_they_were() {
        let relations = [("enrollments", Some("e"))];
        let sql = "SELECT section_id, * FROM enrollments e WHERE e.course_id = 3";
        let refs = with_bare(sql, &relations, &["section_id", "*"]);
        assert_eq!(
            requalified(sql, &refs, "e", "course_id", None, university()).map(|r| r.sql).as_deref(),
            Some("SELECT e.section_id, e.* FROM enrollments e JOIN uni.sections AS sections ON sections.section_id = e.section_id WHERE sections.course_id = 3")
        );
        // `*` over two relations would gain the new relation's columns.
        let relations = [("enrollments", Some("e")), ("students", Some("s"))];
        let sql = "SELECT * FROM enrollments e, students s WHERE e.course_id = 3";
        let refs = with_bare(sql, &relations, &["*"]);
        assert_eq!(
            requalified(sql, &refs, "e", "course_id", None, university()),
            None
        );
    }

    #[test]
    fn a_name_of_a_select_inside_that_the_new_relation_would_take_over_stops_the_join() {
        // sections has semester; in the subquery, semester is the outer query's (or grades').
        let sql = "SELECT 1 FROM enrollments WHERE course_id = 3 AND 2 IN (SELECT 2 FROM grades WHERE semester = 1)";
        let mut refs = with_bare(sql, &[("enrollments", None)], &["course_id"]);
        let at = refs.selects[0].bare[0].1;
        refs.selects.push(Select {
            parent: Some(0),
            relations: vec![RelationRef {
                schema: None,
                name: "grades".into(),
                alias: None,
                at: sql.find("grades"),
            }],
            opaque: false,
            bare: vec![(Some("semester".into()), sql.find("semester").unwrap_or(0))],
            ..Select::default()
        });
        fn semesters(relation: &str, column: &str) -> Option<bool> {
            match (relation, column) {
                ("sections", "semester") => Some(true),
                ("grades", _) => Some(false),
                _ => (university().has_column)(relation, column),
            }
        }
        let taken_over: Lookup = Schema {
            has_column: semesters,
            hops: university().hops,
        };
        assert_eq!(
            joined_around(sql, &refs, at, "course_id", &taken_over),
            None
        );
        // When the subquery's own relation has it, the name stays its.
        let kept: Lookup = Schema {
            has_column: |relation: &str, column: &str| match (relation, column) {
                ("grades", "semester") => Some(true),
                _ => semesters(relation, column),
            },
            hops: university().hops,
        };
        assert!(joined_around(sql, &refs, at, "course_id", &kept).is_some());
    }

    #[test]
    fn an_unqualified_column_is_not_joined_to_where_that_would_be_a_guess() {
        let sql = "SELECT 1 FROM enrollments WHERE course_id = 3";
        let one = [("enrollments", None)];
        // Two keys lead to it.
        let twice: Lookup = Schema {
            has_column: university().has_column,
            hops: |r: &str, c: Option<&str>| {
                let mut found = (university().hops)(r, c);
                found.extend(found.clone());
                found
            },
        };
        assert_eq!(around(sql, &one, &["course_id"], "course_id", twice), None);
        // Nothing a key away has it (nor two: see below).
        let sql = "SELECT 1 FROM enrollments WHERE budget = 3";
        assert_eq!(around(sql, &one, &["budget"], "budget", university()), None);
        // The query names the new relation already.
        let sql = "SELECT 1 FROM enrollments, courses sections WHERE course_id = 3";
        let relations = [("enrollments", None), ("courses", Some("sections"))];
        assert_eq!(
            around(sql, &relations, &["course_id"], "course_id", university()),
            None
        );
        // A common table expression of its name: the join would read that instead.
        let sql = "SELECT 1 FROM enrollments WHERE course_id = 3";
        let mut refs = with_bare(sql, &one, &["course_id"]);
        let at = refs.selects[0].bare[0].1;
        assert!(joined_around(sql, &refs, at, "course_id", &university()).is_some());
        refs.ctes.push("sections".into());
        assert_eq!(
            joined_around(sql, &refs, at, "course_id", &university()),
            None
        );
        // A reference sections.x inside the SELECT that stands for an outer query's relation
        // would be taken over; one that stands for a subquery's own sections would not.
        let with_subquery = |sql: &str, inner: &[(&str, Option<&str>)]| {
            let refs = with_inner(with_bare(sql, &one, &["course_id"]), sql, "(SELECT", inner);
            let at = refs.selects[0].bare[0].1;
            joined_around(sql, &refs, at, "course_id", &university())
        };
        let sql = "SELECT 1 FROM enrollments WHERE course_id = 3 AND EXISTS (SELECT 1 FROM x WHERE x.a = sections.b)";
        assert_eq!(with_subquery(sql, &[("x", None)]), None);
        // A subquery with a relation of that name: the model used it there (joined here too,
        // an IN or EXISTS over it would no longer be tied to this row).
        let sql = "SELECT 1 FROM enrollments WHERE course_id = 3 AND EXISTS (SELECT 1 FROM sections WHERE sections.b = 1)";
        assert_eq!(with_subquery(sql, &[("sections", None)]), None);
        // A sibling subquery's relation of that name is its own.
        let sql = "SELECT 1 FROM x WHERE a IN (SELECT 1 FROM sections) AND b IN (SELECT enrollment_id FROM enrollments WHERE course_id = 3)";
        let relation = |name: &str| RelationRef {
            schema: None,
            name: name.into(),
            alias: None,
            at: sql
                .find(&format!("{name} WHERE"))
                .or(sql.find(&format!("{name})"))),
        };
        let word = |w: &str| sql.find(w).unwrap_or(0);
        let refs = References {
            relations: vec![relation("x"), relation("sections"), relation("enrollments")],
            selects: vec![
                Select {
                    relations: vec![relation("x")],
                    bare: vec![
                        (Some("a".into()), word("a IN")),
                        (Some("b".into()), word("b IN")),
                    ],
                    ..Select::default()
                },
                Select {
                    parent: Some(0),
                    relations: vec![relation("sections")],
                    ..Select::default()
                },
                Select {
                    parent: Some(0),
                    relations: vec![relation("enrollments")],
                    bare: vec![
                        (Some("enrollment_id".into()), word("enrollment_id")),
                        (Some("course_id".into()), word("course_id")),
                    ],
                    ..Select::default()
                },
            ],
            ..References::default()
        };
        assert_eq!(
            joined_around(sql, &refs, word("course_id"), "course_id", &university()).map(|r| r.sql).as_deref(),
            Some("SELECT 1 FROM x WHERE a IN (SELECT 1 FROM sections) AND b IN (SELECT enrollment_id FROM enrollments JOIN uni.sections AS sections ON sections.section_id = enrollments.section_id WHERE course_id = 3)")
        );
        // `*` over two relations would gain the new relation's columns.
        let sql = "SELECT * FROM enrollments, courses WHERE course_id = 3";
        let relations = [("enrollments", None), ("courses", None)];
        assert_eq!(
            around(
                sql,
                &relations,
                &["*", "course_id"],
                "course_id",
                university()
            ),
            None
        );
        // The new relation has a name no relation of the FROM clause has (an outer query's
        // column): it would take it over.
        let sql = "SELECT 1 FROM enrollments WHERE course_id = section_no";
        let shadowing: Lookup = Schema {
            has_column: |r: &str, c: &str| match (r, c) {
                ("sections", "section_no") => Some(true),
                _ => (university().has_column)(r, c),
            },
            hops: university().hops,
        };
        assert_eq!(
            around(
                sql,
                &one,
                &["course_id", "section_no"],
                "course_id",
                shadowing
            ),
            None
        );
    }

    #[test]
    fn a_from_item_ends_after_its_name_and_alias() {
        let sql = "SELECT 1 FROM public.\"Enroll ments\" AS  \"E\" WHERE true";
        assert_eq!(
            item_end(sql, 14, Some("E")),
            Some(sql.find(" WHERE").unwrap())
        );
        let sql = "SELECT 1 FROM enrollments e, x";
        assert_eq!(item_end(sql, 14, Some("e")), Some(27));
        assert_eq!(item_end(sql, 14, None), Some(25));
        assert_eq!(item_end(sql, 14, Some("f")), None);
        assert_eq!(item_end("FROM asx", 5, Some("x")), None);
    }

    /// battle(id, name), ship(id, lost_in_battle, ship_type), crew(name).
    fn battles_columns(relation: &str, column: &str) -> Option<bool> {
        let columns: &[&str] = match relation {
            "battle" => &["id", "name"],
            "ship" => &["id", "lost_in_battle", "ship_type"],
            "crew" => &["name"],
            _ => return None,
        };
        Some(columns.contains(&column))
    }

    #[test]
    fn a_join_written_the_wrong_way_round_is_swapped() {
        // Aliases as the parser folds them.
        let relations = [("battle", Some("t1")), ("ship", Some("t2"))];
        let sql = "SELECT DISTINCT T1.id, T1.name FROM battle AS T1 JOIN ship AS T2 ON T1.lost_in_battle = T2.id WHERE T2.ship_type = 'Brig'";
        assert_eq!(
            requalified(sql, &read_refs(sql, &relations), "t1", "lost_in_battle", None, battles()),
            Some(Requalified {
                sql: "SELECT DISTINCT T1.id, T1.name FROM battle AS T1 JOIN ship AS T2 ON t2.lost_in_battle = t1.id WHERE T2.ship_type = 'Brig'".into(),
                change: "t1.lost_in_battle = t2.id → t2.lost_in_battle = t1.id".into(),
            })
        );
        // Where the qualifier's relation lacks the other column too, no swap makes a join of
        // it, and moving the column would join ship with itself.
        let sql = "SELECT c.name FROM crew c JOIN ship s ON c.lost_in_battle = s.id";
        let relations = [("crew", Some("c")), ("ship", Some("s"))];
        assert_eq!(
            requalified(
                sql,
                &read_refs(sql, &relations),
                "c",
                "lost_in_battle",
                None,
                battles()
            ),
            None
        );
    }

    #[test]
    fn a_requalification_that_would_be_a_guess_is_not_made() {
        let with = |sql: &str, relations: &[(&str, Option<&str>)], q: &str, c: &str| {
            requalified(sql, &read_refs(sql, relations), q, c, None, derm())
        };
        // The join itself is wrong: ae.drug_id = d.drug_id would become d.drug_id = d.drug_id.
        let sql =
            "SELECT d.drug_name FROM adverse_events ae JOIN drugs d ON ae.drug_id = d.drug_id";
        assert_eq!(
            with(
                sql,
                &[("adverse_events", Some("ae")), ("drugs", Some("d"))],
                "ae",
                "drug_id"
            ),
            None
        );
        // Two relations have the column, and the query does not join them on it.
        let sql = "SELECT ae.drug_id FROM adverse_events ae JOIN treatments t ON t.treatment_id = ae.treatment_id JOIN drugs d ON d.drug_name = t.treatment_id::text";
        assert_eq!(
            with(
                sql,
                &[
                    ("adverse_events", Some("ae")),
                    ("treatments", Some("t")),
                    ("drugs", Some("d"))
                ],
                "ae",
                "drug_id"
            ),
            None
        );
        // No relation of the query has it.
        let sql = "SELECT ae.drug_name FROM adverse_events ae";
        assert_eq!(
            with(sql, &[("adverse_events", Some("ae"))], "ae", "drug_name"),
            None
        );
        // The qualifier's relation is unknown (a CTE's, or in no schema shown) or has it.
        let sql = "SELECT x.drug_id FROM x JOIN treatments t ON true";
        assert_eq!(
            with(
                sql,
                &[("x", None), ("treatments", Some("t"))],
                "x",
                "drug_id"
            ),
            None
        );
        let sql = "SELECT t.drug_id FROM treatments t JOIN drugs d ON true";
        assert_eq!(
            with(
                sql,
                &[("treatments", Some("t")), ("drugs", Some("d"))],
                "t",
                "drug_id"
            ),
            None
        );
        // The owner's name stands for two relations of the query.
        let sql = "SELECT ae.drug_id FROM adverse_events ae, treatments, public.treatments";
        let refs = References {
            relations: vec![
                RelationRef {
                    schema: None,
                    name: "adverse_events".into(),
                    alias: Some("ae".into()),
                    at: None,
                },
                RelationRef {
                    schema: None,
                    name: "treatments".into(),
                    alias: None,
                    at: None,
                },
                RelationRef {
                    schema: None,
                    name: "treatments".into(),
                    alias: Some("treatments".into()),
                    at: None,
                },
            ],
            ..read_refs(sql, &[])
        }
        .in_one_select();
        assert_eq!(requalified(sql, &refs, "ae", "drug_id", None, derm()), None);
    }

    /// `refs` with the part of `sql` from `inner` on as a SELECT inside the first one, whose
    /// FROM clause has `relations`: the column references written there are its.
    fn with_inner(
        mut refs: References,
        sql: &str,
        inner: &str,
        relations: &[(&str, Option<&str>)],
    ) -> References {
        let start = sql.find(inner).unwrap_or(sql.len());
        for c in refs
            .columns
            .iter_mut()
            .chain(refs.equalities.iter_mut().flatten())
        {
            if c.at >= start {
                c.select = Some(1);
            }
        }
        let relations: Vec<RelationRef> = relations
            .iter()
            .map(|(name, alias)| RelationRef {
                schema: None,
                name: name.to_string(),
                alias: alias.map(str::to_string),
                at: None,
            })
            .collect();
        refs.relations.extend(relations.iter().cloned());
        refs.selects.push(Select {
            parent: Some(0),
            relations,
            opaque: false,
            bare: Vec::new(),
            ..Select::default()
        });
        refs
    }

    /// The references of `sql` whose part from "(SELECT" on is a subquery.
    fn nested(
        sql: &str,
        outer: &[(&str, Option<&str>)],
        inner: &[(&str, Option<&str>)],
    ) -> References {
        with_inner(read_refs(sql, outer), sql, "(SELECT", inner)
    }

    #[test]
    fn a_qualifier_is_read_where_it_is_written() {
        let outer = [("adverse_events", Some("ae")), ("treatments", Some("t"))];
        // The subquery's own ae is drugs, which has drug_id: its reference stays.
        let sql = "SELECT ae.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id WHERE EXISTS (SELECT 1 FROM drugs ae WHERE ae.drug_id = 1)";
        let refs = nested(sql, &outer, &[("drugs", Some("ae"))]);
        assert_eq!(
            requalified(sql, &refs, "ae", "drug_id", None, derm()).map(|r| r.sql).as_deref(),
            Some("SELECT t.drug_id FROM adverse_events ae JOIN treatments t ON ae.treatment_id = t.treatment_id WHERE EXISTS (SELECT 1 FROM drugs ae WHERE ae.drug_id = 1)")
        );
        // Reported in the subquery (PostgreSQL's position), where ae has the column: nothing.
        let at = sql.rfind("ae.drug_id");
        assert_eq!(requalified(sql, &refs, "ae", "drug_id", at, derm()), None);

        // From a correlated subquery, to the outer query's relation.
        let sql = "SELECT t.patient_id FROM treatments t WHERE EXISTS (SELECT 1 FROM adverse_events ae WHERE ae.treatment_id = t.treatment_id AND ae.drug_id = 2)";
        let refs = nested(
            sql,
            &[("treatments", Some("t"))],
            &[("adverse_events", Some("ae"))],
        );
        assert_eq!(
            requalified(sql, &refs, "ae", "drug_id", sql.find("ae.drug_id"), derm())
                .map(|r| r.sql)
                .as_deref(),
            Some("SELECT t.patient_id FROM treatments t WHERE EXISTS (SELECT 1 FROM adverse_events ae WHERE ae.treatment_id = t.treatment_id AND t.drug_id = 2)")
        );
        // There the subquery's own t (patients, without drug_id) hides the outer one.
        let sql = "SELECT 1 FROM treatments t WHERE EXISTS (SELECT 1 FROM adverse_events ae JOIN patients t ON true WHERE ae.drug_id = 2)";
        let refs = nested(
            sql,
            &[("treatments", Some("t"))],
            &[("adverse_events", Some("ae")), ("patients", Some("t"))],
        );
        assert_eq!(requalified(sql, &refs, "ae", "drug_id", None, derm()), None);

        // A relation of another SELECT (out of reach) is no owner.
        let sql = "SELECT ae.drug_id FROM adverse_events ae WHERE ae.treatment_id IN (SELECT treatment_id FROM treatments)";
        let refs = nested(
            sql,
            &[("adverse_events", Some("ae"))],
            &[("treatments", None)],
        );
        assert_eq!(requalified(sql, &refs, "ae", "drug_id", None, derm()), None);
    }

    #[test]
    fn identifiers_are_measured_and_written_as_the_parser_reads_them() {
        assert_eq!(written_length("ae.drug_id", "ae"), Some(2));
        assert_eq!(written_length("AE.drug_id", "ae"), Some(2));
        assert_eq!(written_length("\"AE\".drug_id", "AE"), Some(4));
        assert_eq!(written_length("\"a\"\"b\".x", "a\"b"), Some(6));
        assert_eq!(written_length("\"AE\".drug_id", "ae"), None);
        assert_eq!(written_length("ab.x", "a"), None);
        assert_eq!(written_length("\"open", "open"), None);
        assert_eq!(identifier("t2"), "t2");
        assert_eq!(identifier("T2"), "\"T2\"");
        assert_eq!(identifier("2t"), "\"2t\"");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(identifier("order"), "\"order\"");
        assert_eq!(identifier("user"), "\"user\"");
        assert_eq!(identifier("orders"), "orders");
    }

    #[test]
    fn the_table_said_to_lack_a_column_is_the_one_its_qualifier_names_where_written() {
        let sql = "SELECT oi.country FROM order_items oi JOIN orders ON orders.id = oi.order_id";
        let refs = read_refs(sql, &[("order_items", Some("oi")), ("orders", None)]);
        assert_eq!(
            lacking(&refs, "oi", "country", None).as_deref(),
            Some("order_items (oi) has no column country.")
        );
        assert_eq!(
            lacking(&refs, "orders", "id", None).as_deref(),
            Some("orders has no column id.")
        );
        assert_eq!(lacking(&refs, "order_items", "country", None), None);
        // A subquery's own o is another table: the line names the one PostgreSQL reported.
        let sql = "SELECT o.name FROM orders o WHERE o.id IN (SELECT o.order_id FROM order_items o WHERE o.name = 'x')";
        let refs = nested(sql, &[("orders", Some("o"))], &[("order_items", Some("o"))]);
        assert_eq!(
            lacking(&refs, "o", "name", sql.rfind("o.name")).as_deref(),
            Some("order_items (o) has no column name.")
        );
        assert_eq!(
            lacking(&refs, "o", "name", sql.find("o.name")).as_deref(),
            Some("orders (o) has no column name.")
        );
    }

    /// `sql`'s references with its GROUP BY list read from the text after "GROUP BY " and
    /// every `a = b` of it taken for a conjunct; `bare`: its unqualified column references.
    fn grouping(sql: &str, relations: &[(&str, Option<&str>)], bare: &[&str]) -> References {
        let mut refs = with_bare(sql, relations, bare);
        let named = |c: &ColumnRef| (Some(c.qualifier.clone()), c.column.clone());
        refs.selects[0].equated = refs
            .equalities
            .iter()
            .map(|[a, b]| [named(a), named(b)])
            .collect();
        refs.selects[0].group_by = sql.find("GROUP BY ").map(|start| {
            let at = start + "GROUP BY ".len();
            GroupBy {
                at,
                columns: sql[at..]
                    .split(" ORDER BY")
                    .next()
                    .unwrap_or_default()
                    .split(", ")
                    .map(|item| match item.split_once('.') {
                        Some((q, c)) => (Some(q.to_lowercase()), c.to_lowercase()),
                        None => (None, item.to_lowercase()),
                    })
                    .collect(),
            }
        });
        refs
    }

    /// customers(customer_id primary key, email unique not null, phone unique, name),
    /// orders(order_id primary key, customer_id, total), in the search path.
    fn shop_keys(schema: Option<&str>, relation: &str) -> Option<schema::Keys> {
        if schema.is_some() {
            return None;
        }
        let key = |k: &[&str]| k.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        match relation {
            "customers" => Some(schema::Keys {
                primary: Some(key(&["customer_id"])),
                unique: vec![key(&["email"])],
            }),
            "orders" => Some(schema::Keys {
                primary: Some(key(&["order_id"])),
                unique: Vec::new(),
            }),
            _ => None,
        }
    }

    /// Their columns' types: integer 23, text 25, numeric 1700; orders.customer_id is a
    /// bigint (20) in `wide`.
    fn shop_columns(schema: Option<&str>, relation: &str, column: &str) -> Option<Option<u32>> {
        let columns: &[(&str, u32)] = match (schema, relation) {
            (None, "customers") => &[
                ("customer_id", 23),
                ("email", 25),
                ("phone", 25),
                ("name", 25),
            ],
            (None, "orders") => &[("order_id", 23), ("customer_id", 23), ("total", 1700)],
            (Some("wide"), "orders") => &[("order_id", 23), ("customer_id", 20)],
            _ => return None,
        };
        Some(columns.iter().find(|(c, _)| *c == column).map(|(_, t)| *t))
    }

    fn ungrouped(column: &str) -> String {
        format!("column \"{column}{UNGROUPED}")
    }

    /// `regrouped` for the error PostgreSQL gives at the first `written` of `sql`.
    fn regroup_at(
        refs: &References,
        sql: &str,
        written: &str,
        reported: &str,
    ) -> Option<Requalified> {
        let at = sql.find(written).unwrap_or(0);
        regrouped(refs, sql, &ungrouped(reported), at, shop_keys, shop_columns)
    }

    #[test]
    fn a_column_each_group_has_one_value_of_is_read_through_its_primary_key() {
        let relations = [("orders", Some("o")), ("customers", Some("c"))];
        let sql = "SELECT c.name, count(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY o.customer_id";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(
            regroup_at(&refs, sql, "c.name", "c.name"),
            Some(Requalified {
                sql: "SELECT c.name, count(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY c.customer_id, o.customer_id".into(),
                change: "c.name → GROUP BY c.customer_id".into(),
            })
        );
        // Grouped by a unique key of NOT NULL columns, directly; the column unqualified.
        let sql = "SELECT name, count(*) FROM customers c JOIN orders o ON c.customer_id = o.customer_id GROUP BY c.email";
        let refs = grouping(sql, &relations, &["name"]);
        assert_eq!(
            regroup_at(&refs, sql, "name", "c.name").map(|r| r.sql).as_deref(),
            Some("SELECT name, count(*) FROM customers c JOIN orders o ON c.customer_id = o.customer_id GROUP BY c.customer_id, c.email")
        );
        // A bare key column counts when no other relation of the SELECT has the name.
        let sql = "SELECT name FROM customers c JOIN orders o ON c.customer_id = o.customer_id GROUP BY email";
        let refs = grouping(sql, &relations, &["name", "email"]);
        assert!(regroup_at(&refs, sql, "name", "c.name").is_some());
    }

    #[test]
    fn a_column_that_may_vary_within_a_group_is_left_to_the_model() {
        let relations = [("orders", Some("o")), ("customers", Some("c"))];
        // A unique key whose column may be NULL: its NULLs are one group of many customers.
        let sql = "SELECT c.name FROM customers c GROUP BY c.phone";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // Grouped by a column that is no key.
        let sql = "SELECT c.email, count(*) FROM customers c JOIN orders o ON c.customer_id = o.customer_id GROUP BY c.name";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "c.email", "c.email"), None);
        // Grouped by the other side of an equality that does not hold in every row (an outer
        // join's, an OR's): no conjunct says so.
        let sql = "SELECT c.name FROM orders o LEFT JOIN customers c ON c.customer_id = o.customer_id GROUP BY o.customer_id";
        let mut refs = grouping(sql, &relations, &[]);
        refs.selects[0].equated.clear();
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // The orders a customer has are many rows: grouping by the customer says nothing of
        // one order's total.
        let sql = "SELECT o.total FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY c.customer_id";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "o.total", "o.total"), None);
        // Equal to a grouped column of another type: `=` may equate values the key tells
        // apart (here bigint and integer would not, but text and citext, bigint and float do).
        let sql = "SELECT c.name FROM wide.orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY o.customer_id";
        let mut refs = grouping(sql, &relations, &[]);
        refs.selects[0].relations[0].schema = Some("wide".into());
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // Equal to a column of an outer query's relation (a row an outer join adds may
        // pair a NULL key with it).
        let sql = "SELECT c.name FROM customers c WHERE c.customer_id = o.customer_id GROUP BY o.customer_id";
        let refs = grouping(sql, &[("customers", Some("c"))], &[]);
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // A relation of another schema than the one the context knows by that name.
        let sql = "SELECT c.name FROM archive.customers c GROUP BY c.email";
        let mut refs = grouping(sql, &[("customers", Some("c"))], &[]);
        refs.selects[0].relations[0].schema = Some("archive".into());
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // A bare key column another relation of the SELECT also has.
        let sql =
            "SELECT c.name FROM customers c JOIN orders o USING (customer_id) GROUP BY customer_id";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
    }

    #[test]
    fn a_grouping_error_is_regrouped_only_as_postgresql_reported_it() {
        let relations = [("orders", Some("o")), ("customers", Some("c"))];
        let sql = "SELECT c.name FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY o.customer_id";
        let refs = grouping(sql, &relations, &[]);
        // Another column reported than the one written there; another error.
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.email"), None);
        let at = sql.find("c.name").unwrap_or(0);
        assert_eq!(
            regrouped(
                &refs,
                sql,
                "subquery uses ungrouped column \"c.name\" from outer query",
                at,
                shop_keys,
                shop_columns
            ),
            None
        );
        // Its primary key already grouped: PostgreSQL's error is about something else.
        let sql = "SELECT c.name FROM customers c GROUP BY c.customer_id";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // No GROUP BY list of plain expressions (none, or grouping sets).
        let sql = "SELECT c.name, count(*) FROM customers c";
        let refs = grouping(sql, &relations, &[]);
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // A first item in parentheses: the key would join a row value.
        let sql = "SELECT c.name FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY (o.customer_id)";
        let mut refs = grouping(sql, &relations, &[]);
        if let Some(g) = refs.selects[0].group_by.as_mut() {
            g.at += 1;
            g.columns = vec![(Some("o".into()), "customer_id".into())];
        }
        assert_eq!(regroup_at(&refs, sql, "c.name", "c.name"), None);
        // A relation without a primary key.
        let sql = "SELECT v.name FROM customer_view v GROUP BY v.customer_id";
        let refs = grouping(sql, &[("customer_view", Some("v"))], &[]);
        assert_eq!(regroup_at(&refs, sql, "v.name", "v.name"), None);
    }
}
