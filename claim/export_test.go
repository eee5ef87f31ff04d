package claim

func ClaimSQLForTest(p *Postgres) string { return p.claimSQL }
