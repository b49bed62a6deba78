//! Saved questions, for BI tools and dbt: a question's checked SQL kept as a view (`nl_view`,
//! `nl_view_refresh`), and answers typed as a row type the caller names (`nl_query_as`).
//!
//! A view is created by an explicit call, as the caller, in the caller's transaction: its body
//! is the query that passed the guard and ran in the sandbox, and its columns are the ones the
//! caller saw. Its comment says which question it answers, so it can be asked again. The view
//! is made from the checked tree written out with every name qualified, analysed behind the
//! same runtime gate as the sandbox's analysis, and what it then stores is checked again as the
//! answer was.

use pgrx::prelude::*;

use crate::error::{Error, Result, SqlError, SqlState};
use crate::exec::{Outcome, ResultSet};
use crate::guard::{self, gate};
use crate::{settings, store, subxact};

/// How a view's comment begins; the question follows on the same line.
const COMMENT_PREFIX: &str = "sql_query_engine question: ";

/// Where a saved question's view goes.
pub struct Target {
    /// `schema.name`, quoted.
    pub qualified: String,
    /// Whether a view of that name is there already.
    pub exists: bool,
}

/// The view `view_name` names (unqualified: in the schema a CREATE VIEW would use), checked
/// before the model is asked anything: a writable transaction, CREATE on the schema, and a
/// free name (or, with `replace`, a view).
pub fn target(view_name: &str, replace: bool) -> Result<Target> {
    if !store::writable() {
        return Err(Error::sql(
            "25006",
            "nl_view creates a view: it cannot run in a read-only transaction",
            None,
        ));
    }
    // The schema an unqualified CREATE VIEW would use, on the caller's search path; the rest
    // is read on the pinned one.
    let current =
        store::read_one::<String>("SELECT pg_catalog.concat(pg_catalog.current_schema())", &[])
            .map_err(|e| Error::internal(format!("reading the current schema: {e}")))?
            .filter(|s| !s.is_empty());
    // schema, name, CREATE allowed, the relation's kind when it exists
    let sql = "
        WITH parts AS (SELECT pg_catalog.parse_ident($1) AS p),
        named AS (
            SELECT CASE pg_catalog.array_length(p, 1) WHEN 1 THEN $2
                        WHEN 2 THEN p[1] END AS schema,
                   p[pg_catalog.array_length(p, 1)] AS name,
                   pg_catalog.array_length(p, 1) AS parts
            FROM parts)
        SELECT pg_catalog.json_build_object(
            'parts', parts, 'schema', schema, 'name', name,
            'exists', EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n
                              WHERE n.nspname = named.schema),
            'create', (SELECT pg_catalog.has_schema_privilege(n.oid, 'CREATE')
                       FROM pg_catalog.pg_namespace n WHERE n.nspname = named.schema),
            'kind', (SELECT c.relkind FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = named.schema AND c.relname = named.name),
            'own', (SELECT c.relowner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(
                               pg_catalog.quote_ident(current_user))::pg_catalog.oid
                    FROM pg_catalog.pg_class c
                    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = named.schema AND c.relname = named.name),
            'qualified', pg_catalog.quote_ident(schema) || '.' || pg_catalog.quote_ident(name)
        )::text FROM named";
    let found = subxact::in_subtransaction(false, || {
        subxact::pinned(|| {
            store::read_one::<String>(sql, &[view_name.into(), current.as_deref().into()])
        })
    });
    let text = match found {
        Ok(Ok(Some(text))) => text,
        Ok(Ok(None)) => return Err(Error::internal("naming the view found nothing")),
        Ok(Err(e)) => return Err(Error::internal(format!("naming the view failed: {e}"))),
        // parse_ident's own error: not a name
        Err(_) => {
            return Err(Error::InvalidParameter(format!(
                "{view_name:?} is not a view name (name or schema.name)"
            )))
        }
    };
    let found: serde_json::Value = serde_json::from_str(&text).map_err(Error::internal)?;
    if found["parts"].as_i64() != Some(1) && found["parts"].as_i64() != Some(2) {
        return Err(Error::InvalidParameter(format!(
            "{view_name:?} is not a view name (name or schema.name)"
        )));
    }
    let Some(schema) = found["schema"].as_str() else {
        return Err(Error::sql(
            "3F000",
            "no schema has been selected to create the view in",
            Some("Qualify the name: nl_view('schema.name', ...)."),
        ));
    };
    if found["exists"] != true {
        return Err(Error::sql(
            "3F000",
            format!("schema \"{schema}\" does not exist"),
            None,
        ));
    }
    if found["create"] != true {
        return Err(Error::sql(
            "42501",
            format!("permission denied for schema {schema}"),
            Some("nl_view creates the view as you: you need CREATE on its schema."),
        ));
    }
    let name = found["name"].as_str().unwrap_or_default();
    let exists = match found["kind"].as_str() {
        None => false,
        // Replaced, a view keeps its owner: it is the caller's only when the caller owns it
        // itself, not through a role it is a member of.
        Some("v") if replace && found["own"] == true => true,
        Some("v") if replace => {
            return Err(Error::sql(
                "42501",
                format!("must be owner of view {name}"),
                Some("nl_view replaces only a view you own yourself: it would stay its owner's."),
            ))
        }
        Some("v") => {
            return Err(Error::sql(
                "42P07",
                format!("relation \"{name}\" already exists"),
                Some("Pass replace => true to redefine it, or ask again with nl_view_refresh."),
            ))
        }
        Some(_) => {
            return Err(Error::sql(
                "42809",
                format!("\"{name}\" is not a view"),
                None,
            ))
        }
    };
    Ok(Target {
        qualified: found["qualified"].as_str().unwrap_or_default().to_string(),
        exists,
    })
}

/// A saved question's view, found by name, with the question its comment names and its
/// definition and columns as they are now.
pub struct Saved {
    pub target: Target,
    pub question: String,
    pub definition: String,
    pub columns: Vec<String>,
}

/// The saved question `view_name` names: a view the caller owns whose comment names a question.
pub fn saved(view_name: &str) -> Result<Saved> {
    if !store::writable() {
        return Err(Error::sql(
            "25006",
            "nl_view_refresh redefines a view: it cannot run in a read-only transaction",
            None,
        ));
    }
    // The comment and the definition are the view owner's to make any length: read cut (a
    // saved question is at most 10,000 characters, its SQL 100,000).
    let sql = "
        SELECT pg_catalog.json_build_object(
            'kind', c.relkind,
            'owner', c.relowner OPERATOR(pg_catalog.=) pg_catalog.to_regrole(
                         pg_catalog.quote_ident(current_user))::pg_catalog.oid,
            'comment', pg_catalog.left(pg_catalog.obj_description(c.oid, 'pg_class'), 20000),
            'definition', CASE WHEN c.relkind = 'v'
                          THEN pg_catalog.left(pg_catalog.pg_get_viewdef(c.oid), 200000) END,
            'columns', (SELECT pg_catalog.json_agg(a.attname || ' ' ||
                                   pg_catalog.format_type(a.atttypid, a.atttypmod)
                                   ORDER BY a.attnum)
                        FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
            'qualified', pg_catalog.quote_ident(n.nspname) || '.' ||
                         pg_catalog.quote_ident(c.relname))::text
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = $1";
    // to_regclass resolves an unqualified name on the caller's search path, as the caller
    // would; the rest of the read uses the pinned one.
    let oid_sql = "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid";
    let resolved = subxact::in_subtransaction(false, || {
        store::read_one::<pg_sys::Oid>(oid_sql, &[view_name.into()])
    });
    let Ok(Ok(Some(oid))) = resolved else {
        return Err(Error::sql(
            "42P01",
            format!("view \"{view_name}\" does not exist"),
            None,
        ));
    };
    let text = subxact::pinned(|| store::read_one::<String>(sql, &[oid.into()]))
        .map_err(|e| Error::internal(format!("reading the view failed: {e}")))?
        .ok_or_else(|| {
            Error::sql(
                "42P01",
                format!("view \"{view_name}\" does not exist"),
                None,
            )
        })?;
    let found: serde_json::Value = serde_json::from_str(&text).map_err(Error::internal)?;
    if found["kind"] != "v" {
        return Err(Error::sql(
            "42809",
            format!("\"{view_name}\" is not a view"),
            None,
        ));
    }
    if found["owner"] != true {
        return Err(Error::sql(
            "42501",
            format!("must be owner of view {view_name}"),
            None,
        ));
    }
    let question = found["comment"]
        .as_str()
        .and_then(|c| c.lines().next())
        .and_then(|line| line.strip_prefix(COMMENT_PREFIX))
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| {
            Error::InvalidParameter(format!(
                "view {view_name} is not a saved question: its comment names no question \
                 (nl_view writes \"{COMMENT_PREFIX}...\")"
            ))
        })?;
    Ok(Saved {
        target: Target {
            qualified: found["qualified"].as_str().unwrap_or_default().to_string(),
            exists: true,
        },
        question: question.to_string(),
        definition: found["definition"].as_str().unwrap_or_default().to_string(),
        columns: found["columns"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// `CREATE [OR REPLACE] VIEW target (columns) AS sql`, then its comment, as the caller. `sql`
/// is the answer's checked tree written out with every name qualified
/// (`ResultSet::qualified_sql`), analysed here on the pinned search path, behind the runtime
/// gate, so that it binds what was checked; what the view then stores is checked again as the
/// answer was (`scope`: the relations it may read), since a relation may have been made again
/// under a name meanwhile: a view that does not pass is an error, which takes it back. A view
/// replaced keeps its options (`security_invoker`, `security_barrier`, `check_option`).
pub fn create(
    target: &Target,
    sql: &str,
    columns: &[String],
    question: &str,
    scope: Option<&guard::Scope>,
) -> Result<()> {
    let quoted: Vec<String> = columns
        .iter()
        .map(|c| format!("\"{}\"", c.replace('"', "\"\"")))
        .collect();
    let view = target
        .exists
        .then(|| locked_own_view(&target.qualified))
        .transpose()?;
    if let Some(view) = view {
        // CREATE OR REPLACE VIEW refuses a column renamed, retyped or dropped, but appends new
        // ones: a view others may read with its owner's rights would show them whatever the
        // model added. A saved question's view keeps exactly its columns.
        let kept: i64 = subxact::pinned(|| {
            store::read_text_now(
                c"SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute \
                  WHERE attrelid OPERATOR(pg_catalog.=) $1 AND attnum OPERATOR(pg_catalog.>) 0 \
                    AND NOT attisdropped",
                &[(pg_sys::OIDOID, view.into())],
            )
        })
        .map_err(|e| Error::internal(format!("reading the view's columns: {e}")))?
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
        if usize::try_from(kept).ok() != Some(columns.len()) {
            return Err(Error::sql(
                "42P16",
                format!(
                    "the new answer has {} columns ({}) where view {} has {kept}: a view keeps \
                     its columns",
                    columns.len(),
                    columns.join(", "),
                    target.qualified
                ),
                Some("To take the new columns, drop the view and save the question again."),
            ));
        }
    }
    // The view runs with its reader's rights (security_invoker), also one it replaces: what
    // it reads, a model chose, and whoever may read the view (a grant it keeps, default
    // privileges) must not read it with its owner's rights.
    let options = match view {
        Some(view) => subxact::pinned(|| {
            store::read_text_now(
                c"SELECT pg_catalog.string_agg(pg_catalog.format('%I = %L', \
                    pg_catalog.split_part(o, '=', 1), \
                    pg_catalog.substr(o, pg_catalog.strpos(o, '=') OPERATOR(pg_catalog.+) 1)), ', ') \
                  FROM pg_catalog.pg_class c, pg_catalog.unnest(c.reloptions) AS o \
                  WHERE c.oid OPERATOR(pg_catalog.=) $1 \
                    AND pg_catalog.split_part(o, '=', 1) OPERATOR(pg_catalog.<>) 'security_invoker'",
                &[(pg_sys::OIDOID, view.into())],
            )
        })
        .map_err(|e| Error::internal(format!("reading the view's options: {e}")))?,
        None => None,
    };
    let options = match options {
        Some(kept) => format!("{kept}, security_invoker = true"),
        None => "security_invoker = true".to_string(),
    };
    let statement = format!(
        "CREATE {}VIEW {} ({}) WITH ({options}) AS\n{sql}\n",
        if target.exists { "OR REPLACE " } else { "" },
        target.qualified,
        quoted.join(", "),
    );
    let trusted = guard::superuser_call();
    let during = [
        "a saved question's view is created",
        "a superuser's saved question's view is created",
    ];
    behind_the_gates(trusted.as_ref(), during, || {
        // CREATE VIEW analyses the text again: its literals are checked again first.
        subxact::pinned_exact(|| guard::check_literals(sql, trusted.as_ref()))
            .map_err(|refusal| Error::Refused(Box::new(refusal.error)))?;
        subxact::pinned_exact(|| Spi::run(&statement))
            .map_err(|e| Error::internal(format!("creating the view: {e}")))
    })?;
    let view = subxact::pinned(|| {
        store::read_one::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
            &[target.qualified.as_str().into()],
        )
    })
    .map_err(|e| Error::internal(format!("finding the view: {e}")))?
    .ok_or_else(|| Error::internal(format!("view {} was not created", target.qualified)))?;
    if let Err(refusal) = guard::check_view(view, Some(&guard::saving_call()), scope) {
        let mut error = refusal.error;
        error.message = format!(
            "view {} is not saved: what it stores differs from the answer that was checked \
             (an object came between): {}",
            target.qualified, error.message
        );
        return Err(Error::Refused(Box::new(error)));
    }
    let model = settings::llm_model().unwrap_or_default();
    let comment = format!(
        "{COMMENT_PREFIX}{}\nWritten by sql_query_engine{} and checked by its guard; asked again \
         with nl_view_refresh('{}').",
        crate::text::single_spaced(question),
        if model.is_empty() {
            String::new()
        } else {
            format!(" (model {model})")
        },
        target.qualified.replace('\'', "''"),
    );
    let statement = subxact::pinned(|| {
        store::read_one::<String>(
            "SELECT pg_catalog.format('COMMENT ON VIEW %s IS %L', $1::text, \
             $2::text || ' ' || pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC', \
             '\"At\" YYYY-MM-DD HH24:MI \"UTC.\"'))",
            &[target.qualified.as_str().into(), comment.as_str().into()],
        )
    })
    .map_err(|e| Error::internal(format!("commenting the view: {e}")))?
    .unwrap_or_default();
    // A COMMENT fires event triggers too: as behind the gates as the CREATE.
    let during = [
        "a saved question's view is commented",
        "a superuser's saved question's view is commented",
    ];
    behind_the_gates(trusted.as_ref(), during, || {
        subxact::pinned(|| Spi::run(&statement))
            .map_err(|e| Error::internal(format!("commenting the view: {e}")))
    })
}

/// Locks the view named `qualified` until the transaction ends, and refuses it unless the
/// caller owns it itself; returns its OID. Checked before the model was asked, it could since
/// have been dropped and made again by a role the caller is a member of, whose view `CREATE OR
/// REPLACE` would replace (it stays its owner's); locked, it stays the view checked until the
/// DDL is done.
fn locked_own_view(qualified: &str) -> Result<pg_sys::Oid> {
    let find = || {
        subxact::pinned(|| {
            store::read_one::<pg_sys::Oid>(
                "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
                &[qualified.into()],
            )
        })
        .map_err(|e| Error::internal(format!("finding the view: {e}")))
    };
    let changed = || {
        Error::sql(
            "42501",
            format!("view {qualified} changed while the question was answered"),
            Some("Ask again."),
        )
    };
    let Some(view) = find()? else {
        return Err(changed());
    };
    // SAFETY: locks a relation by OID, as CREATE OR REPLACE VIEW is about to; an ERROR (a lock
    // timeout) unwinds as any other.
    unsafe { pg_sys::LockRelationOid(view, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE) };
    if find()? != Some(view) {
        return Err(changed());
    }
    // SAFETY: reads the backend's current user.
    let caller = unsafe { pg_sys::GetUserId() };
    // As the catalog is now: its owner may have been changed while the model thought.
    let own = subxact::pinned(|| {
        store::read_text_now(
            c"SELECT relkind OPERATOR(pg_catalog.=) 'v' AND relowner OPERATOR(pg_catalog.=) $2 \
              FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) $1",
            &[
                (pg_sys::OIDOID, view.into()),
                (pg_sys::OIDOID, caller.into()),
            ],
        )
    })
    .map_err(|e| Error::internal(format!("reading the view's owner: {e}")))?;
    if own.as_deref() != Some("t") {
        return Err(Error::sql(
            "42501",
            format!("must be owner of view {qualified}"),
            Some("nl_view replaces only a view you own yourself: it would stay its owner's."),
        ));
    }
    Ok(view)
}

/// Runs `work`, DDL of a saved question's view, behind the runtime gate (`during`: what the
/// gate says is happening, for any call and for a superuser's): every function it runs, an
/// event trigger's too, must pass the function policy, and for a superuser's call be a trusted
/// owner's.
fn behind_the_gates<T>(
    trusted: Option<&guard::Trusted>,
    during: [&'static str; 2],
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let _gate = gate::open(
        gate::Rule::Allowed(std::rc::Rc::new(guard::allowed_functions())),
        during[0],
    );
    let _superuser_gate = trusted
        .cloned()
        .map(|t| gate::open(gate::Rule::TrustedOwners(t), during[1]));
    work()
}

/// Redefines the saved question `before` with a new answer. When PostgreSQL refuses because
/// the columns changed (CREATE OR REPLACE VIEW keeps names and types), the error says which
/// and how to take the new ones; any other error is raised as it is.
pub fn redefine(
    before: &Saved,
    view_name: &str,
    sql: &str,
    columns: &[String],
    scope: Option<&guard::Scope>,
) -> Result<()> {
    // An error of `create` is raised inside: the subtransaction, and the view, roll back.
    let created = subxact::in_subtransaction(true, || {
        create(&before.target, sql, columns, &before.question, scope).unwrap_or_else(|e| e.raise())
    });
    let caught = match created {
        Ok(()) => return Ok(()),
        Err(caught) => caught,
    };
    let sqlstate = match caught.as_ref() {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r) => {
            Some(SqlState::from_code(r.sql_error_code()))
        }
        _ => None,
    };
    // 42P16: a column renamed or dropped; 42804: a column's type changed
    match sqlstate.filter(|s| matches!(s.as_str(), "42P16" | "42804")) {
        Some(sqlstate) => Err(Error::Query(Box::new(SqlError {
            sqlstate,
            message: format!(
                "the new answer's columns ({}) do not fit view {view_name}'s ({})",
                columns.join(", "),
                before.columns.join(", ")
            ),
            detail: Some(format!("The new SQL: {sql}")),
            hint: Some(format!(
                "A view keeps its columns. To take the new ones: DROP VIEW {view_name}, then \
                 nl_view('{view_name}', the same question)."
            )),
            ..Default::default()
        }))),
        None => (*caught).rethrow(),
    }
}

/// One field of the row type an answer is converted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub type_name: String,
}

/// The fields of row type `typ` (`NULL::my_type`, or a table's row type), whose types a value
/// may be converted to without running code nobody asked for: built-in types, enums, arrays of
/// them, and domains over them without CHECK constraints, of the caller's or a superuser's
/// (another role may add a CHECK after any check, and the conversion reads the catalog afresh).
pub fn shape(typ: pg_sys::Oid) -> Result<Vec<Field>> {
    let text = subxact::pinned(|| store::read_text_now(SHAPE_SQL, &[(pg_sys::OIDOID, typ.into())]))
        .map_err(|e| Error::internal(format!("reading the row type: {e}")))?;
    shape_of(text)
}

/// `shape` again after a wait (the model's), as the conversion will find the type: with the
/// row type's relation locked until the transaction ends (no attribute is added meanwhile);
/// `shape` reads the catalog as it is now (a CHECK its owner added to a domain while the model
/// thought would run in the conversion, as the caller).
pub fn shape_now(typ: pg_sys::Oid) -> Result<Vec<Field>> {
    // Checked before the lock as well: a type given by OID names any relation, and a lock is
    // taken only on one the caller may use (as `LOCK TABLE` asks for a privilege).
    shape(typ)?;
    // SAFETY: a catalog look-up by OID, and a lock on the type's relation, as ALTER TYPE takes
    // one (stronger); an ERROR unwinds as any other.
    unsafe {
        let relation = pg_sys::get_typ_typrelid(typ);
        if relation != pg_sys::InvalidOid {
            pg_sys::LockRelationOid(relation, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        }
    }
    shape(typ)
}

/// What `shape` reads of a row type: its fields, their types, whether converting a value to
/// each would run code of its own, and what the caller may not use of it (the type comes as
/// an OID, which no name look-up checked: another session's temporary table, a schema without
/// USAGE, a table the caller may not read).
const SHAPE_SQL: &std::ffi::CStr = c"
        SELECT pg_catalog.json_build_object(
            'unusable', CASE
                WHEN pg_catalog.pg_is_other_temp_schema(t.typnamespace)
                    THEN 'it is another session''s temporary type'
                WHEN pg_catalog.has_schema_privilege(t.typnamespace, 'USAGE') IS NOT TRUE
                    THEN 'you do not have USAGE on its schema'
                WHEN pg_catalog.has_type_privilege(t.oid, 'USAGE') IS NOT TRUE
                    THEN 'you do not have USAGE on it'
                WHEN c.relkind <> 'c'
                     AND pg_catalog.has_any_column_privilege(c.oid, 'SELECT') IS NOT TRUE
                    THEN 'you may not read its table' END,
            'composite', t.typrelid <> 0,
            'fields', (SELECT pg_catalog.json_agg(pg_catalog.json_build_object(
                           'name', a.attname,
                           'oid', a.atttypid::pg_catalog.int8,
                           'type', pg_catalog.format_type(a.atttypid, a.atttypmod),
                           -- A domain of the caller's or a superuser's only: another
                           -- role may add a CHECK between this read and the conversion,
                           -- which no lock here keeps out.
                           'refused', NOT (
                               f.oid < 16384 OR f.typtype = 'e'
                               OR e.oid IS NOT NULL AND (e.oid < 16384 OR e.typtype = 'e')
                                  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k
                                                  WHERE k.contypid = f.oid AND k.contype = 'c')
                                  AND (f.typtype <> 'd'
                                       OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles o
                                                  WHERE o.oid = f.typowner
                                                    AND (o.rolsuper
                                                         OR o.rolname = CURRENT_USER)))))
                           ORDER BY a.attnum)
                       FROM pg_catalog.pg_attribute a
                       JOIN pg_catalog.pg_type f ON f.oid = a.atttypid
                       -- the base of a domain, the element of an array
                       LEFT JOIN pg_catalog.pg_type e ON e.oid = CASE
                           WHEN f.typtype = 'd' THEN f.typbasetype
                           WHEN f.typelem <> 0 AND f.typlen = -1 THEN f.typelem END
                       WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
            'name', pg_catalog.format_type(t.oid, NULL))::text
        FROM pg_catalog.pg_type t
        LEFT JOIN pg_catalog.pg_class c ON c.oid = t.typrelid
        WHERE t.oid = $1";

fn shape_of(text: Option<String>) -> Result<Vec<Field>> {
    let text =
        text.ok_or_else(|| Error::InvalidParameter("the shape's type does not exist".into()))?;
    let found: serde_json::Value = serde_json::from_str(&text).map_err(Error::internal)?;
    let type_name = found["name"].as_str().unwrap_or_default();
    // The names go to the model as part of the question, and into messages: another role
    // chose them, so, as the schema context does, none may hold a character that is not
    // shown (a line break that starts a line of its own in the prompt or an ERROR).
    let unshown = |name: &str| !crate::names::printable(name);
    if unshown(type_name) {
        return Err(Error::InvalidParameter(
            "nl_query_as: the row type's name holds a character that is not shown".into(),
        ));
    }
    if let Some(why) = found["unusable"].as_str() {
        return Err(Error::sql(
            "42501",
            format!("permission denied for the row type {type_name}: {why}"),
            Some("Pass the row type of a table you may read, or a type of your own."),
        ));
    }
    if found["composite"] != true {
        return Err(Error::sql(
            "42804",
            format!("nl_query_as needs a row type, and {type_name} is not one"),
            Some("Pass NULL::a_composite_type or NULL::a_table_name."),
        ));
    }
    let fields = found["fields"].as_array().cloned().unwrap_or_default();
    if fields.is_empty() {
        return Err(Error::sql(
            "42804",
            format!("the row type {type_name} has no columns"),
            None,
        ));
    }
    let mut out = Vec::with_capacity(fields.len());
    for field in fields {
        let (name, typ) = (
            field["name"].as_str().unwrap_or_default().to_string(),
            field["type"].as_str().unwrap_or_default().to_string(),
        );
        if unshown(&name) || unshown(&typ) {
            return Err(Error::InvalidParameter(format!(
                "nl_query_as: field {} of the row type {type_name} has a name or type name that \
                 holds a character that is not shown",
                out.len() + 1
            )));
        }
        // A value naming a type or a routine (`regtype`, `regprocedure`, ...) runs, converted
        // from the model's text, the modifier input code of the type it names, which no gate
        // sees: a query may not compute one either.
        let names_code = field["oid"]
            .as_u64()
            .and_then(|oid| u32::try_from(oid).ok())
            .is_none_or(|oid| guard::names_code(pg_sys::Oid::from(oid)));
        if field["refused"] == true || names_code {
            return Err(Error::sql(
                "42501",
                format!(
                    "nl_query_as converts answers only to built-in types (but those naming types \
                     or routines), enums, arrays of them and domains over them without CHECK \
                     constraints that are yours or a superuser's; {type_name}.{name} is of \
                     type {typ}"
                ),
                Some("Converting to other types runs their own code: convert the rows yourself."),
            ));
        }
        out.push(Field {
            name,
            type_name: typ,
        });
    }
    Ok(out)
}

/// The question as the model is asked it when the answer must fit `fields`.
pub fn shaped_question(question: &str, fields: &[Field]) -> String {
    let columns: Vec<String> = fields
        .iter()
        .map(|f| format!("{} ({})", crate::names::quoted(&f.name), f.type_name))
        .collect();
    format!(
        "{question}\nReturn exactly these columns, in this order: {}.",
        columns.join(", ")
    )
}

/// `outcome` of a query whose result must have one column per field: a result with another
/// count is an error the model is asked to repair.
pub fn fit(outcome: Outcome, fields: &[Field]) -> Outcome {
    let columns = match outcome.result() {
        Some(r) => r.columns.clone(),
        None => return outcome,
    };
    if columns.len() == fields.len() {
        return outcome;
    }
    let wanted: Vec<String> = fields
        .iter()
        .map(|f| format!("{} {}", f.name, f.type_name))
        .collect();
    Outcome::Failed(SqlError {
        sqlstate: SqlState::parse("42804"),
        message: format!(
            "the query returns {} columns ({}); the answer needs {}: {}",
            columns.len(),
            columns.join(", "),
            fields.len(),
            wanted.join(", ")
        ),
        hint: Some("Return exactly these columns, in this order.".into()),
        ..Default::default()
    })
}

/// The rows of `result` keyed by the fields' names, column by column in order (the model's
/// own column names do not matter, their order does).
pub fn rekeyed(result: &ResultSet, fields: &[Field]) -> Vec<serde_json::Value> {
    crate::trace::rows_in_column_order(result)
        .into_iter()
        .map(|row| {
            let values = row.as_array().cloned().unwrap_or_default();
            serde_json::Value::Object(
                fields
                    .iter()
                    .zip(values)
                    .map(|(f, v)| (f.name.clone(), v))
                    .collect(),
            )
        })
        .collect()
}
