// What a JDBC client (the PostgreSQL JDBC driver, as BI tools such as Metabase, Tableau or
// DBeaver use it) sees of a relation: each column's name, JDBC type and Java class, then the
// first row. Run as a single-file program:
//   java -cp /usr/share/java/postgresql.jar tests/clients/ViewColumns.java JDBC_URL USER RELATION
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.JDBCType;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.Statement;

public class ViewColumns {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0], args[1], "");
             Statement s = c.createStatement();
             ResultSet r = s.executeQuery("SELECT * FROM " + args[2])) {
            ResultSetMetaData m = r.getMetaData();
            for (int i = 1; i <= m.getColumnCount(); i++) {
                System.out.println("column " + m.getColumnName(i) + " " + JDBCType.valueOf(m.getColumnType(i))
                        + " " + m.getColumnClassName(i));
            }
            if (r.next()) {
                StringBuilder row = new StringBuilder("row");
                for (int i = 1; i <= m.getColumnCount(); i++) {
                    row.append(' ').append(r.getObject(i));
                }
                System.out.println(row);
            }
        }
    }
}
