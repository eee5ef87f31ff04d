// Package riverbilling bills customers through River, the PostgreSQL job
// queue (github.com/riverqueue/river), on as many machines as you run,
// still exactly once.
//
// River delivers jobs at least once: a job can run twice (its rescuer
// re-runs a job it thinks is stuck; a worker killed after Stripe answered
// is retried), its default retries go on for about 20 days, far past
// Stripe's 24-hour idempotency window, and unique jobs stop blocking
// duplicates once completed jobs are cleaned away. Each job here charges
// through a [billing.Biller], whose keys, claims and key deadline turn
// every one of those repeats into a replay, a wait or a search, never a
// second charge.
//
// # Set-up
//
// Apply River's migrations (rivermigrate, or the river CLI) and the claim
// table's, then register the workers and give billing a queue of its own:
//
//	biller, _ := billing.New(billing.Config{SecretKey: key, Claims: store, Price: price})
//	charge, _ := riverbilling.NewWorker(biller, riverbilling.WorkerConfig{})
//	fanOut, _ := riverbilling.NewFanOutWorker(riverbilling.FanOutConfig{
//		DB:        pool,
//		Customers: func(ctx context.Context, period string) iter.Seq2[billing.Item, error] { ... },
//	})
//	workers := river.NewWorkers()
//	river.AddWorker(workers, charge)
//	river.AddWorker(workers, fanOut)
//	client, _ := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		// Each job bills up to billing.DefaultConcurrency (8) customers at once.
//		Queues:  map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: 4}},
//		Workers: workers,
//		PeriodicJobs: []*river.PeriodicJob{riverbilling.PeriodicFanOut(
//			river.PeriodicInterval(time.Hour),
//			func(t time.Time) string { return t.UTC().Format("2006-01") }, nil)},
//	})
//	_ = client.Start(ctx)
//
// Run the same program on every machine. River's leader inserts the
// period's [FanOutArgs] job once; its [FanOutWorker] streams the period's
// customers (the iterator [billing.Biller.Run] takes) and inserts a
// [ChargeArgs] job for each hundred of them (FanOutConfig.BatchSize), a
// thousand customers per transaction; every machine's [Worker] works
// them, each job's customers in one [billing.Biller.Run], whose claims are
// made and outcomes recorded in batches (a job per customer costs a claim
// statement and a record statement per customer, and bills a period
// several times slower).
//
// # Outcomes
//
// A charge job completes when the customer is billed (now or before),
// is cancelled on a decline (never retried: re-billing is a new job with
// ChargeArgs.Attempt 2), is snoozed while another run holds the
// customer's claim (a re-bill also while an earlier attempt is still
// being sent or processing: its outcome decides whether the re-bill
// bills), and is retried with the same key when the outcome is
// unknown, on a schedule that ends hours before the key's deadline (see
// [DefaultMaxAttempts] for the arithmetic). A spend-cap, revoked-key,
// permission or configuration answer cancels the job and pauses the
// queue. [Worker] has the details.
//
// A job of several customers keeps those outcomes for each of them: it
// completes once its Run went through, and every customer the Run did not
// bill (declined, held by another runner, outcome unknown) is handed on to
// a job of its own, inserted before the job of several completes: at once
// for a decline (that job meets the failed claim and is cancelled with the
// reason, without calling Stripe), scheduled for the other runner's lease
// or the first retry otherwise. A Run cut short (the job's timeout, the
// database) retries the job, and a spend cap cancels it and pauses the
// queue, as for a job of one.
//
// A job may run again long after it first ran: a retry, a rescue, a job
// inserted again by a fan-out. Every run derives the same keys and meets
// the same claims, so it replays, waits, finds or searches; it never sends
// a second charge. A job of several customers run again finds the ones
// billed already billed, in one claim statement, and hands on the ones
// another run holds.
//
// # Invoices
//
// A charge job with [ChargeArgs].Invoice set bills its customer by one
// Stripe invoice ([billing.Biller.Invoice]) instead of a charge, with the
// lines the Biller's Config.Invoice returns when the job runs: one draft,
// each line once, one finalization, one payment (or sending), however
// often the job runs. A fan-out inserts such jobs for the items whose
// Invoice is &billing.Invoice{} (the lines are Config.Invoice's, never an
// item's). A customer invoiced for a period is not charged for it too:
// a charge job for the same period is cancelled.
//
// # Usage reports
//
// Usage sent to a Stripe meter goes through River the same way: insert
// one [UsageArgs] job per report (a [billing.Usage]: customer, meter,
// window, value) and register a [UsageWorker] beside the charge worker,
// in the same queue, with the same [WorkerConfig]. The worker calls
// [billing.Biller.ReportUsage], whose claim and identifier make every
// run of a job, every retry and a job inserted again send at most one
// meter event, and maps its answers as the charge worker does: a report
// delivered now or before completes; one Stripe rejected (in a meter
// error report that reached [billing.Biller.Webhook]), an invalid one,
// or one whose kind does not match its meter is cancelled and never
// retried; a report another runner holds is snoozed; an unknown outcome
// is retried on the charge schedule with the same identifier, and past
// the key's deadline is settled from the meter's summary instead of sent
// again. Report a rejected window again with the next Usage.Attempt.
//
//	usage, _ := riverbilling.NewUsageWorker(biller, riverbilling.WorkerConfig{})
//	river.AddWorker(workers, usage)
//	_, _ = client.Insert(ctx, riverbilling.UsageArgs{Usage: billing.Usage{
//		Customer: "cus_1", Meter: "api_calls", Kind: billing.Increments,
//		Start: hour, End: hour.Add(time.Hour), Value: 1200}}, nil)
//
// # Refunds, transfers and payouts
//
// Money going out has one job kind: a [MoneyOutArgs] job makes one refund
// of a customer's payment of a period (its refund id, the caller's name
// for it), one transfer to a connected account, or one payout made on
// that account, and a [MoneyOutWorker] beside the others, with the same
// [WorkerConfig], makes it through [billing.Biller.Refund],
// [billing.Biller.Transfer] or [billing.Biller.Payout]. Their claims and
// keys make every run of a job, every retry and a job inserted again move
// the money at most once, and their answers go to River as a charge's do:
// made now or before completes the job, a pending refund or a payout on
// its way included (its webhook or Reconcile settles it); a refusal of
// the movement itself (balance_insufficient, a disputed payment, a refund
// of more than is left of its payment) cancels it with the reason, never
// retried; an unknown outcome is retried with the same key, and past the
// key's deadline found by listing instead of sent again. Paying again is
// a new job: the next Attempt of a transfer or payout (snoozed, as a
// re-bill is, while an earlier attempt is still processing), or a new
// refund id. A mass refund or a payout sweep is a job per movement, or one
// [billing.Biller.Run] of items with a Refund, Transfer or Payout.
//
//	moneyOut, _ := riverbilling.NewMoneyOutWorker(biller, riverbilling.WorkerConfig{})
//	river.AddWorker(workers, moneyOut)
//	_, _ = client.Insert(ctx, riverbilling.MoneyOutArgs{Period: "2026-11",
//		Customer: "cus_1", Refund: "outage-2026-11", Amount: 500}, nil)
//	_, _ = client.Insert(ctx, riverbilling.MoneyOutArgs{Period: "2026-11",
//		Payout: true, Account: "acct_1", Amount: 40000, Currency: "usd"}, nil)
//
// # Watching a period
//
// [State] counts a period's jobs by River state and its claims by state,
// for an operator or a dashboard next to River UI: the claims count
// customers, the jobs count jobs (a job of several customers once).
//
// # Run or River
//
// [billing.Biller.Run] on one replica, under a lock, is enough for a
// period that one machine bills in the time it has. Move to River when the
// run must survive deploys and machines, be spread across them, or share
// a queue and its tooling with the rest of your jobs. Both use the same
// claims and keys: a period started by Run can be finished by River jobs,
// and the other way round.
package riverbilling
