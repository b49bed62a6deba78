//! Schema facts for repairing a name error. PostgreSQL says what is wrong (`column
//! oi.customer_id does not exist`, `missing FROM-clause entry for table "p"`); a small model
//! fixes such an error far more often when it is also told which table the alias stands for,
//! where the column really is, and how to join to it.

use crate::error::{SqlError, SqlState};
use crate::guard::{self, RelationRef};
use crate::schema;

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
    let refs = guard::relation_refs(sql);
    let mut lines = Vec::new();
    let column = match &problem {
        NameError::UnknownRelation => None,
        NameError::MissingColumn { qualifier, column } => {
            if let Some((table, alias)) = qualifier.as_deref().and_then(|q| resolve(&refs, q)) {
                let alias = alias.map(|a| format!(" ({a})")).unwrap_or_default();
                lines.push(format!("{table}{alias} has no column {column}."));
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
    let names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
    let list_all = problem == NameError::UnknownRelation;
    lines.extend(schema::context().ok()?.describe(&names, column, list_all));
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The table a qualifier stands for, and the alias when it is one.
fn resolve<'a>(refs: &'a [RelationRef], qualifier: &'a str) -> Option<(&'a str, Option<&'a str>)> {
    refs.iter()
        .find(|r| r.alias.as_deref() == Some(qualifier))
        .map(|r| (r.name.as_str(), Some(qualifier)))
        .or_else(|| {
            refs.iter()
                .find(|r| r.alias.is_none() && r.name == qualifier)
                .map(|r| (r.name.as_str(), None))
        })
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

    #[test]
    fn a_qualifier_resolves_to_its_table_by_alias_or_by_name() {
        let refs = vec![
            RelationRef {
                name: "order_items".into(),
                alias: Some("oi".into()),
            },
            RelationRef {
                name: "orders".into(),
                alias: None,
            },
        ];
        assert_eq!(resolve(&refs, "oi"), Some(("order_items", Some("oi"))));
        assert_eq!(resolve(&refs, "orders"), Some(("orders", None)));
        assert_eq!(
            resolve(&refs, "order_items"),
            None,
            "an aliased table is known by its alias"
        );
    }
}
