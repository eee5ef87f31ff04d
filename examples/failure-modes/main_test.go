package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFailureModes runs the gallery: in every row billonce must charge each
// customer exactly once, by the fake Stripe's ledger, and the unsafe code
// must not (otherwise the row no longer shows its failure mode).
func TestFailureModes(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := gallery(ctx, pool, dbURL, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(scenarios) {
		t.Fatalf("%d rows for %d scenarios", len(rows), len(scenarios))
	}
	for i, r := range rows {
		t.Run(scenarios[i].id, func(t *testing.T) {
			if r.billonce != r.expected {
				t.Errorf("%s: billonce %v, want %v", r.name, r.billonce, r.expected)
			}
			if r.naive == r.expected {
				t.Errorf("%s: the unsafe code charged %v, the right answer: the failure did not happen", r.name, r.naive)
			}
		})
	}
	var out bytes.Buffer
	printTable(&out, rows)
	for _, s := range scenarios {
		if !strings.Contains(out.String(), s.name) {
			t.Errorf("table has no row %q:\n%s", s.name, out.String())
		}
	}
	if !allExact(rows) && !t.Failed() {
		t.Error("allExact is false although every billonce row matched")
	}
	t.Logf("\n%s", out.String())
}

func TestAllExact(t *testing.T) {
	good := row{naive: tally{2, 1, 1}, billonce: exactlyOnce(1), expected: exactlyOnce(1)}
	bad := row{naive: tally{2, 1, 1}, billonce: tally{2, 1, 1}, expected: exactlyOnce(1)}
	for _, c := range []struct {
		rows []row
		want bool
	}{
		{nil, false},
		{[]row{good}, true},
		{[]row{good, bad}, false},
	} {
		if got := allExact(c.rows); got != c.want {
			t.Errorf("allExact(%d rows) = %v, want %v", len(c.rows), got, c.want)
		}
	}
}
