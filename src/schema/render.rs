//! Rendering the schema for the model: DDL-like lines, the form models read best, with keys,
//! references and comments inline so that joins are visible where the columns are.

use std::fmt::Write;

use super::catalog::Relation;

/// The prompt text for `relations`, in the order given.
pub fn render(relations: &[Relation]) -> String {
    let mut out = String::new();
    for relation in relations {
        render_relation(&mut out, relation);
    }
    if out.is_empty() {
        out.push_str("-- (no tables or views are visible to you)\n");
    }
    out
}

fn render_relation(out: &mut String, relation: &Relation) {
    let keyword = match relation.kind.as_str() {
        "view" => "VIEW",
        "materialized view" => "MATERIALIZED VIEW",
        "foreign table" => "FOREIGN TABLE",
        _ => "TABLE",
    };
    let _ = write!(out, "CREATE {keyword} {} (", relation.sql_name());
    let mut notes = Vec::new();
    if let Some(comment) = relation
        .comment
        .as_deref()
        .map(one_line)
        .filter(|c| !c.is_empty())
    {
        notes.push(comment);
    }
    if relation.rows >= 0.0 {
        notes.push(format!("~{} rows", relation.rows.round() as i64));
    }
    if !notes.is_empty() {
        let _ = write!(out, " -- {}", notes.join("; "));
    }
    out.push('\n');

    let single_pk = (relation.primary_key.len() == 1).then(|| relation.primary_key[0].as_str());
    let mut lines: Vec<(String, Option<String>)> = relation
        .columns
        .iter()
        .map(|column| {
            let mut line = format!("  {} {}", column.name, column.type_name);
            if single_pk == Some(column.name.as_str()) {
                line.push_str(" PRIMARY KEY");
            } else if column.not_null {
                line.push_str(" NOT NULL");
            }
            if let Some(fk) = relation
                .foreign_keys
                .iter()
                .find(|fk| fk.columns.len() == 1 && fk.columns[0] == column.name)
            {
                let _ = write!(
                    line,
                    " REFERENCES {}({})",
                    fk.references,
                    fk.ref_columns.join(", ")
                );
            }
            let comment = column
                .comment
                .as_deref()
                .map(one_line)
                .filter(|c| !c.is_empty());
            (line, comment)
        })
        .collect();
    if relation.primary_key.len() > 1 {
        lines.push((
            format!("  PRIMARY KEY ({})", relation.primary_key.join(", ")),
            None,
        ));
    }
    for fk in relation
        .foreign_keys
        .iter()
        .filter(|fk| fk.columns.len() > 1)
    {
        lines.push((
            format!(
                "  FOREIGN KEY ({}) REFERENCES {}({})",
                fk.columns.join(", "),
                fk.references,
                fk.ref_columns.join(", ")
            ),
            None,
        ));
    }
    let last = lines.len().saturating_sub(1);
    for (i, (line, comment)) in lines.into_iter().enumerate() {
        out.push_str(&line);
        if i < last {
            out.push(',');
        }
        if let Some(comment) = comment {
            let _ = write!(out, " -- {comment}");
        }
        out.push('\n');
    }
    out.push_str(");\n");
}

/// Comments go on one line so that they cannot end the `--` comment they are written in.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::super::catalog::{Column, ForeignKey, Relation};
    use super::render;

    fn column(name: &str, type_name: &str, not_null: bool, comment: Option<&str>) -> Column {
        Column {
            name: name.into(),
            type_name: type_name.into(),
            not_null,
            comment: comment.map(str::to_string),
        }
    }

    #[test]
    fn tables_render_as_ddl_with_keys_and_comments() {
        let orders = Relation {
            schema: "public".into(),
            name: "orders".into(),
            kind: "table".into(),
            visible: true,
            comment: Some("One row per\norder".into()),
            rows: 1234.0,
            columns: vec![
                column("id", "integer", true, None),
                column("customer_id", "integer", true, None),
                column("\"Status\"", "text", false, Some("new, paid or shipped")),
            ],
            primary_key: vec!["id".into()],
            foreign_keys: vec![ForeignKey {
                columns: vec!["customer_id".into()],
                references: "sales.customers".into(),
                ref_columns: vec!["id".into()],
            }],
        };
        assert_eq!(
            render(&[orders]),
            "CREATE TABLE orders ( -- One row per order; ~1234 rows\n\
             \x20 id integer PRIMARY KEY,\n\
             \x20 customer_id integer NOT NULL REFERENCES sales.customers(id),\n\
             \x20 \"Status\" text -- new, paid or shipped\n\
             );\n"
        );
    }

    #[test]
    fn composite_keys_hidden_schemas_and_unanalyzed_tables() {
        let items = Relation {
            schema: "shop".into(),
            name: "items".into(),
            kind: "view".into(),
            visible: false,
            comment: None,
            rows: -1.0,
            columns: vec![
                column("a", "int", true, None),
                column("b", "int", true, None),
            ],
            primary_key: vec!["a".into(), "b".into()],
            foreign_keys: vec![ForeignKey {
                columns: vec!["a".into(), "b".into()],
                references: "pairs".into(),
                ref_columns: vec!["x".into(), "y".into()],
            }],
        };
        assert_eq!(
            render(&[items]),
            "CREATE VIEW shop.items (\n  a int NOT NULL,\n  b int NOT NULL,\n  PRIMARY KEY (a, b),\n  \
             FOREIGN KEY (a, b) REFERENCES pairs(x, y)\n);\n"
        );
        assert!(render(&[]).contains("no tables"));
    }
}
