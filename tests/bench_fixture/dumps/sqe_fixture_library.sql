-- A tiny library, the benchmark harness's own test database.
CREATE TABLE authors (author_id integer PRIMARY KEY, name text NOT NULL, born integer);
CREATE TABLE books (
    book_id integer PRIMARY KEY,
    author_id integer NOT NULL REFERENCES authors(author_id),
    title text NOT NULL,
    published date NOT NULL,
    price numeric(6,2) NOT NULL
);
INSERT INTO authors VALUES (1, 'Ursula', 1929), (2, 'Italo', 1923), (3, 'Wislawa', 1923);
INSERT INTO books VALUES
    (1, 1, 'The Dispossessed', '1974-05-01', 12.50),
    (2, 1, 'The Lathe of Heaven', '1971-01-01', 9.99),
    (3, 2, 'Invisible Cities', '1972-11-01', 11.00),
    (4, 2, 'If on a winter''s night a traveler', '1979-06-01', 14.25),
    (5, 3, 'View with a Grain of Sand', '1995-04-01', 16.00);
