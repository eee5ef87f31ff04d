package idemvet

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/ast/astutil"
)

// Report categories, one per rule.
const (
	RetryKey   = "retrykey"
	FreshKey   = "freshkey"
	FixedKey   = "fixedkey"
	NoKey      = "nokey"
	PoolLock   = "poollock"
	XactLock   = "xactlock"
	ignoreHead = "//idemvet:ignore"
)

func (c *checker) readIgnores(f *ast.File) {
	for _, cg := range f.Comments {
		for _, cm := range cg.List {
			if !strings.HasPrefix(cm.Text, ignoreHead) {
				continue
			}
			p := c.pass.Fset.Position(cm.Pos())
			if c.ignores[p.Filename] == nil {
				c.ignores[p.Filename] = map[int]string{}
			}
			c.ignores[p.Filename][p.Line] = strings.TrimSpace(strings.TrimPrefix(cm.Text, ignoreHead))
		}
	}
}

func (c *checker) report(pos token.Pos, category, format string, args ...any) {
	if c.reported[pos] {
		return
	}
	c.reported[pos] = true
	msg := fmt.Sprintf(format, args...)
	p := c.pass.Fset.Position(pos)
	lines := []int{p.Line, p.Line - 1}
	// A directive above a statement covers all of its lines.
	for _, f := range c.pass.Files {
		if f.FileStart <= pos && pos < f.FileEnd {
			path, _ := astutil.PathEnclosingInterval(f, pos, pos)
			for _, n := range path {
				if st, ok := n.(ast.Stmt); ok {
					if _, block := st.(*ast.BlockStmt); !block {
						l := c.pass.Fset.Position(st.Pos()).Line
						lines = append(lines, l, l-1)
						break
					}
				}
			}
		}
	}
	bare := false
	for _, line := range lines {
		if reason, ok := c.ignores[p.Filename][line]; ok {
			if reason != "" {
				return
			}
			bare = true
		}
	}
	if bare {
		msg += " (the //idemvet:ignore next to it is not honoured without a reason after it)"
	}
	c.pass.Report(analysis.Diagnostic{Pos: pos, Category: category, Message: msg})
}

// ---- keys ----

func (c *checker) checkKeys(f *ast.File, fd *ast.FuncDecl) {
	for _, s := range c.sinks(fd) {
		var origins []origin
		c.trace(s.key, func(o origin) { origins = append(origins, o) })
		bs := c.retries(s, c.boundaries(f, s.node.Pos()))
		if c.checkRetryKey(s, origins, bs) || c.checkFreshKey(f, s, origins, bs) {
			continue
		}
		c.checkFixedKey(f, fd, s, origins)
	}
}

// retries drops from bs the loops and recursions that walk a collection:
// the request changes from pass to pass with the loop's counter or the
// parameters the recursive call changes, so each pass is a new operation,
// not another attempt of one.
func (c *checker) retries(s sink, bs []boundary) []boundary {
	var req []origin
	for _, r := range s.request {
		c.trace(r, func(o origin) { req = append(req, o) })
	}
	var out []boundary
	for _, b := range bs {
		walk := false
		for _, o := range req {
			if o.v != nil && b.passVars[o.v] {
				walk = true
			}
		}
		if !walk {
			out = append(out, b)
		}
	}
	return out
}

func (c *checker) checkRetryKey(s sink, origins []origin, bs []boundary) bool {
	for _, b := range bs {
		for _, o := range origins {
			in := b.from <= o.pos && o.pos < b.to
			var why string
			switch {
			case o.kind == oSource && in:
				why = "it is made by " + o.desc + " inside it"
			case o.kind == oCounter && in:
				why = "it includes " + o.desc + ", which changes on every pass"
			case o.kind == oRangeVar && o.loop == b.node:
				why = "it includes the loop variable " + o.desc + ", a new value on every attempt"
			case o.kind == oParam && b.attemptNo[o.v]:
				why = "it includes the attempt number " + o.desc
			default:
				continue
			}
			c.report(s.node.Pos(), RetryKey,
				"idempotency key changes between attempts: %s, and %s; when Stripe commits an attempt whose response is lost, the next attempt carries a new key and charges again. "+
					"Make the key once per operation from what identifies it (customer, period: idemkey.For) before the retry starts, and send that same key on every attempt",
				b.what, why)
			return true
		}
	}
	return false
}

// checkFreshKey reports a key made from a random source or the clock for
// one call, with no retry in sight that reuses it: it is worth no more than
// the random key stripe-go adds by itself.
func (c *checker) checkFreshKey(f *ast.File, s sink, origins []origin, bs []boundary) bool {
	if len(bs) > 0 {
		return false
	}
	path, _ := astutil.PathEnclosingInterval(f, s.node.Pos(), s.node.Pos())
	for _, o := range origins {
		if o.kind != oSource {
			continue
		}
		shared := false
		for _, n := range path {
			switch n.(type) {
			case *ast.ForStmt, *ast.RangeStmt, *ast.FuncLit:
				if !within(n, o.pos) {
					shared = true // the key is made once and used on several passes or calls
				}
			}
		}
		if shared {
			continue
		}
		c.report(s.node.Pos(), FreshKey,
			"idempotency key made by %s for this one request: a retry of the code around it, a restart or the next run makes another key, and Stripe charges again (it is no safer than sending no key). "+
				"Derive the key from what identifies the operation (customer, period: idemkey.For) so every attempt, replica and rerun sends the same one",
			o.desc)
		return true
	}
	return false
}

// expand replaces each field read by the origins of its base, keeping the
// field read itself.
func (c *checker) expand(origins []origin) []origin {
	var out []origin
	var add func(o origin, depth int)
	add = func(o origin, depth int) {
		out = append(out, o)
		if o.kind == oField && depth < 4 {
			// c.cfg.Key: c.cfg, then c.
			c.trace(o.sel.X, func(b origin) { add(b, depth+1) })
		}
	}
	for _, o := range origins {
		add(o, 0)
	}
	return out
}

// customerOf returns the values the request gives its Customer field.
func customerOf(request []ast.Expr) []ast.Expr {
	var out []ast.Expr
	for _, r := range request {
		ast.Inspect(r, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Customer" {
					out = append(out, n.Value)
				}
			}
			return true
		})
	}
	return out
}

// perOperation reports whether recv, whose field the key is read from, is
// built per operation rather than once for many: the request's customer
// comes from recv too, or recv's type is built with its key field made
// from a value that also fills another field (&op{customer: c, key:
// "charge:" + c + ":" + period}). A customer given as a parameter of fd
// says recv serves many customers.
func (c *checker) perOperation(fd *ast.FuncDecl, recv *types.Var, s sink, keyOrigins []origin) bool {
	fromRecv := false
	for _, e := range customerOf(s.request) {
		var os []origin
		c.trace(e, func(o origin) { os = append(os, o) })
		for _, o := range c.expand(os) {
			switch {
			case o.kind == oParam && o.v == recv:
				fromRecv = true
			case o.kind == oParam && c.params[o.v] == fd:
				return false
			}
		}
	}
	if fromRecv {
		return true
	}
	fields := map[string]bool{}
	for _, o := range keyOrigins {
		if o.kind == oField {
			if id, ok := ast.Unparen(o.sel.X).(*ast.Ident); ok && c.pass.TypesInfo.Uses[id] == recv {
				fields[o.sel.Sel.Name] = true
			}
		}
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	paramsOf := func(e ast.Expr) map[*types.Var]bool {
		ps := map[*types.Var]bool{}
		c.trace(e, func(o origin) {
			if (o.kind == oParam || o.kind == oRangeVar) && !isContext(o.v.Type()) {
				ps[o.v] = true
			}
		})
		return ps
	}
	found := false
	for _, f := range c.pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || found || !types.Identical(c.pass.TypesInfo.TypeOf(lit), t) {
				return !found
			}
			var keyPs []map[*types.Var]bool
			others := map[*types.Var]bool{}
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				id, ok := kv.Key.(*ast.Ident)
				if !ok {
					continue
				}
				if fields[id.Name] {
					keyPs = append(keyPs, paramsOf(kv.Value))
				} else {
					for v := range paramsOf(kv.Value) {
						others[v] = true
					}
				}
			}
			for _, ps := range keyPs {
				for v := range ps {
					if others[v] {
						found = true
					}
				}
			}
			return !found
		})
	}
	return found
}

func (c *checker) checkFixedKey(f *ast.File, fd *ast.FuncDecl, s sink, origins []origin) {
	// A field read's base counts: a key field of a value built before the
	// loop is fixed for the loop, whatever the value was built from.
	all := c.expand(origins)
	var reqOrigins []origin
	for _, r := range s.request {
		c.trace(r, func(o origin) { reqOrigins = append(reqOrigins, o) })
	}
	reqOrigins = c.expand(reqOrigins)

	// A range loop over a collection: the key must change with the element.
	path, _ := astutil.PathEnclosingInterval(f, s.node.Pos(), s.node.Pos())
	for _, n := range path {
		rs, ok := n.(*ast.RangeStmt)
		if !ok {
			continue
		}
		if t, ok := c.pass.TypesInfo.TypeOf(rs.X).Underlying().(*types.Basic); ok && t.Info()&types.IsInteger != 0 {
			continue
		}
		inLoop := func(o origin) bool {
			return (o.kind == oRangeVar && o.loop == rs) || (o.pos >= rs.Body.Pos() && o.pos < rs.Body.End())
		}
		invariant := true
		for _, o := range all {
			if inLoop(o) && o.kind != oField || o.kind == oSource && inLoop(o) {
				invariant = false
			}
		}
		varies := false
		for _, o := range reqOrigins {
			if o.kind == oRangeVar && o.loop == rs {
				varies = true
			}
		}
		if tv, ok := c.pass.TypesInfo.Types[s.key]; ok && tv.Value != nil {
			break // a literal key ("k"): a fixture, each pass usually aimed at its own server
		}
		if invariant && varies {
			c.report(s.node.Pos(), FixedKey,
				"the same idempotency key %s is sent for every element of the range loop at line %d while the rest of the request changes: Stripe runs the first request only and answers every later one with its result or an idempotency_error, so only the first is charged. "+
					"Make the key inside the loop from what identifies each operation (customer, period: idemkey.For)",
				keyText(s.key), c.pass.Fset.Position(rs.Pos()).Line)
			return
		}
		break
	}

	// A key read from the receiver or a package variable, in a function
	// whose parameters say which operation it is.
	for _, o := range origins {
		if o.kind == oSource || o.kind == oCounter {
			return // the key itself changes per call: not fixed
		}
	}
	var recv *types.Var
	if fd.Recv != nil && len(fd.Recv.List) > 0 && len(fd.Recv.List[0].Names) > 0 {
		recv, _ = c.pass.TypesInfo.Defs[fd.Recv.List[0].Names[0]].(*types.Var)
	}
	fromRecv, fromPkg := false, false
	for _, o := range all {
		switch {
		case o.kind == oField, o.kind == oSource:
		case o.kind == oPkgVar:
			fromPkg = true
		case o.kind == oParam && recv != nil && o.v == recv:
			fromRecv = true
		default:
			return // depends on something that may change per call
		}
	}
	if !fromRecv && !fromPkg {
		return
	}
	var varying *types.Var
	for _, o := range reqOrigins {
		if o.kind == oParam && o.v != recv && !isContext(o.v.Type()) && c.params[o.v] == fd {
			varying = o.v
			break
		}
	}
	if varying == nil || fromRecv && c.perOperation(fd, recv, s, all) {
		return
	}
	where := "a package variable, set once per process"
	if fromRecv {
		where = "a field of " + recv.Name() + ", set once when it was built"
	}
	c.report(s.node.Pos(), FixedKey,
		"idempotency key %s is %s, so every call of %s sends the same key whatever %s it is given: Stripe runs the first request only and answers every later one with its result or an idempotency_error. "+
			"Make the key per operation from its identity (%s, period: idemkey.For)",
		keyText(s.key), where, fd.Name.Name, varying.Name(), varying.Name())
}

func keyText(e ast.Expr) string {
	if call, ok := e.(*ast.CallExpr); ok && len(call.Args) == 1 {
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "String" {
			e = call.Args[0] // stripe.String(k)
		}
	}
	return types.ExprString(e)
}

func isContext(t types.Type) bool {
	return types.TypeString(t, nil) == "context.Context"
}

// ---- stripe-go writes without a key ----

var writeMethod = regexp.MustCompile(`^(New|Create|Confirm|Pay|Capture|Increment.*)$`)

// moneyPkgs are the stripe-go resources whose duplicate moves or bills
// money: a second charge, invoice, subscription, usage record, refund,
// transfer or payout. A duplicate token, customer, webhook endpoint or
// checkout session is clutter, not a double charge; -allwrites reports
// writes of every resource.
var moneyPkgs = map[string]bool{
	"charge": true, "paymentintent": true, "invoice": true, "invoiceitem": true,
	"subscription": true, "subscriptionitem": true, "subscriptionschedule": true,
	"usagerecord": true, "meterevent": true, "refund": true, "creditnote": true,
	"transfer": true, "transferreversal": true, "payout": true, "topup": true,
	"customerbalancetransaction": true, "feerefund": true,
	"outboundpayment": true, "outboundtransfer": true, "inboundtransfer": true,
}

// oldNames are the names stripe-go gave these packages before v74.
var oldNames = map[string]string{
	"sub": "subscription", "subitem": "subscriptionitem", "subschedule": "subscriptionschedule",
	"reversal": "transferreversal",
}

var allWrites bool

func init() {
	Analyzer.Flags.BoolVar(&allWrites, "allwrites", false,
		"report keyless writes of every stripe-go resource, not only those that move or bill money")
}

// packageResource returns the resource of a stripe-go package whose writes
// are checked for a key, or "".
func packageResource(path string) string {
	if strings.Contains(path, "/testhelpers") {
		return "" // test-mode helpers: no money moves
	}
	name := path[strings.LastIndex(path, "/")+1:]
	if long, ok := oldNames[name]; ok {
		name = long
	}
	if !allWrites && !moneyPkgs[name] {
		return ""
	}
	return name
}

func (c *checker) checkWrites(fd *ast.FuncDecl) {
	info := c.pass.TypesInfo
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fn, ok := typeutilCallee(info, call).(*types.Func)
		if !ok || fn.Pkg() == nil || !writeMethod.MatchString(fn.Name()) {
			return true
		}
		res := writeResource(fn)
		if res == "" {
			return true
		}
		sig := fn.Type().(*types.Signature)
		for i, a := range call.Args {
			if i >= sig.Params().Len() {
				break
			}
			t := sig.Params().At(i).Type()
			if obj, _, _ := types.LookupFieldOrMethod(t, true, nil, "IdempotencyKey"); obj == nil {
				continue
			}
			if c.lacksKey(fd, call, a) {
				c.report(call.Pos(), NoKey,
					"%s sends a Stripe write without an idempotency key: stripe-go then makes a random key for this call only, so any retry around it (a job rerun, a queue redelivery, a retry loop, a restart) makes a second %s. "+
						"Set params.IdempotencyKey from what identifies the operation (customer, period: idemkey.For)",
					types.ExprString(call.Fun), res+" object")
			}
		}
		return true
	})
}

// v82ff's stripe.Client: sc.V1Charges.Create is a method of the root
// package's v1ChargeService.
var rootService = regexp.MustCompile(`^v[0-9]+([A-Za-z]+)Service$`)

// writeResource returns the stripe-go resource (charge, paymentintent)
// that fn writes, if its writes are checked for a key, or "".
func writeResource(fn *types.Func) string {
	path := fn.Pkg().Path()
	if !stripeAny.MatchString(path) {
		return ""
	}
	if !stripeRoot.MatchString(path) {
		return packageResource(path)
	}
	recv := fn.Type().(*types.Signature).Recv()
	if recv == nil {
		return ""
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok {
		return ""
	}
	m := rootService.FindStringSubmatch(n.Obj().Name())
	if m == nil || strings.HasPrefix(m[1], "TestHelpers") {
		return ""
	}
	// v1BillingMeterEventService, v1TreasuryOutboundPaymentService: the
	// resource is the name's end.
	res, best := strings.ToLower(m[1]), ""
	for r := range moneyPkgs {
		if strings.HasSuffix(res, r) && len(r) > len(best) {
			best = r
		}
	}
	if best == "" && allWrites {
		return res
	}
	return best
}

// lacksKey reports whether the params a of the write call are sure to carry
// no key: nil, a literal without one, or a local variable built from such a
// literal that gets no key and is handed to no other code before the write.
func (c *checker) lacksKey(fd *ast.FuncDecl, call ast.Node, a ast.Expr) bool {
	a = ast.Unparen(a)
	if isNil(a) {
		return true
	}
	if u, ok := a.(*ast.UnaryExpr); ok && u.Op == token.AND {
		a = u.X
	}
	switch a := a.(type) {
	case *ast.CompositeLit:
		return !litHasKey(a)
	case *ast.CallExpr:
		return c.keylessCall(a)
	case *ast.Ident:
		v := c.localVar(a)
		if v == nil {
			return false
		}
		if _, isParam := c.params[v]; isParam || len(c.defs[v]) == 0 {
			return false
		}
		for _, d := range c.defs[v] {
			if d.kind == defZero {
				continue // var p stripe.ChargeParams
			}
			rhs := ast.Unparen(d.rhs)
			if u, ok := rhs.(*ast.UnaryExpr); ok && u.Op == token.AND {
				rhs = u.X
			}
			if call, ok := rhs.(*ast.CallExpr); ok {
				if b, ok := typeutilCallee(c.pass.TypesInfo, call).(*types.Builtin); ok && b.Name() == "new" {
					continue // new(stripe.ChargeParams)
				}
				if c.keylessCall(call) {
					continue // p := buildParams(customer)
				}
			}
			lit, ok := rhs.(*ast.CompositeLit)
			if !ok || litHasKey(lit) {
				return false
			}
		}
		return !c.mayGetKey(fd, call, v)
	}
	return false
}

// keylessCall reports whether call is to a function that builds params
// without a key (keylessResult).
func (c *checker) keylessCall(call *ast.CallExpr) bool {
	fn, ok := typeutilCallee(c.pass.TypesInfo, call).(*types.Func)
	if !ok {
		return false
	}
	if c.keyless[fn] {
		return true
	}
	var f keylessResult
	return fn.Pkg() != c.pass.Pkg && c.pass.ImportObjectFact(fn.Origin(), &f)
}

// returnsParams reports whether sig's first result, and no other, can
// carry an idempotency key (Stripe params or a pointer to them).
func returnsParams(sig *types.Signature) bool {
	r := sig.Results()
	for i := range r.Len() {
		obj, _, _ := types.LookupFieldOrMethod(r.At(i).Type(), true, nil, "IdempotencyKey")
		if _, isField := obj.(*types.Var); isField != (i == 0) {
			return false
		}
	}
	return r.Len() > 0
}

// returnsKeyless reports whether every return of fd gives params sure to
// carry no key.
func (c *checker) returnsKeyless(fd *ast.FuncDecl) bool {
	some, all := false, true
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) == 0 || !c.lacksKey(fd, n, n.Results[0]) {
				all = false
			}
			some = true
		}
		return all
	})
	return some && all
}

// runsBefore reports whether code at pos may run before the write call:
// it comes first, or shares a loop with the call, or fd jumps backwards.
func runsBefore(fd *ast.FuncDecl, call ast.Node, pos token.Pos) bool {
	if pos < call.Pos() {
		return true
	}
	before := false
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			// A write in a function literal runs when the literal is
			// called, maybe after code that follows it.
			if within(n, call.Pos()) && !within(n, pos) {
				before = true
			}
		case *ast.ForStmt, *ast.RangeStmt:
			if within(n, call.Pos()) && within(n, pos) {
				before = true
			}
		case *ast.BranchStmt:
			if n.Tok == token.GOTO {
				before = true
			}
		}
		return !before
	})
	return before
}

func litHasKey(lit *ast.CompositeLit) bool {
	found := false
	ast.Inspect(lit, func(n ast.Node) bool {
		if kv, ok := n.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "IdempotencyKey" {
				found = true
			}
		}
		return !found
	})
	return found
}

// mayGetKey reports whether v's key may be set in fd before the write call,
// or v leaves fd's sight before it: any use other than reading or writing a
// field, calling a stripe-go method with it, or a stripe-go write.
func (c *checker) mayGetKey(fd *ast.FuncDecl, call ast.Node, v *types.Var) bool {
	info := c.pass.TypesInfo
	may := false
	var stack []ast.Node
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return false
		}
		stack = append(stack, n)
		id, ok := n.(*ast.Ident)
		if !ok || info.Uses[id] != v || !runsBefore(fd, call, id.Pos()) {
			return true
		}
		parent := stack[len(stack)-2]
		switch p := parent.(type) {
		case *ast.SelectorExpr:
			if p.Sel.Name == "IdempotencyKey" || p.Sel.Name == "SetIdempotencyKey" || p.Sel.Name == "Params" {
				// p.Params.IdempotencyKey, p.Params = ...: look at the next selector.
				if p.Sel.Name != "Params" {
					may = true
				} else if len(stack) >= 3 {
					if gp, ok := stack[len(stack)-3].(*ast.SelectorExpr); !ok || gp.Sel.Name == "IdempotencyKey" || gp.Sel.Name == "SetIdempotencyKey" {
						may = true
					}
				}
			}
		case *ast.CallExpr:
			fn, ok := typeutilCallee(info, p).(*types.Func)
			if !ok || fn.Pkg() == nil || !stripeAny.MatchString(fn.Pkg().Path()) {
				may = true
			}
		case *ast.AssignStmt:
			for _, r := range p.Rhs {
				if r == id {
					may = true // copied elsewhere
				}
			}
		default:
			may = true
		}
		return true
	})
	return may
}

// ---- advisory locks through a pool ----

var (
	sessionLock = regexp.MustCompile(`(?i)pg_(try_)?advisory_lock(_shared)?\s*\(`)
	unlock      = regexp.MustCompile(`(?i)pg_advisory_unlock(_shared|_all)?\s*\(`)
	xactLock    = regexp.MustCompile(`(?i)pg_(try_)?advisory_xact_lock(_shared)?\s*\(`)
	pgxpoolPath = regexp.MustCompile(`^github\.com/jackc/pgx(/v[0-9]+)?/pgxpool$`)
)

// poolType returns a name for t if it is a connection pool: statements
// sent through it may each run on a different session.
func poolType(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return ""
	}
	path, name := n.Obj().Pkg().Path(), n.Obj().Name()
	switch {
	case pgxpoolPath.MatchString(path) && name == "Pool":
		return "*pgxpool.Pool"
	case path == "database/sql" && name == "DB":
		return "*sql.DB"
	case path == "github.com/jmoiron/sqlx" && name == "DB":
		return "*sqlx.DB"
	}
	return ""
}

func (c *checker) checkLocks(fd *ast.FuncDecl) {
	info := c.pass.TypesInfo
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pool := poolType(info.TypeOf(sel.X))
		if pool == "" {
			return true
		}
		sql := ""
		for _, a := range call.Args {
			if s, ok := c.constString(a); ok {
				sql = s
				break
			}
		}
		switch {
		case unlock.MatchString(sql) && sessionLock.MatchString(sql):
			// Locked and unlocked by one statement: one session, balanced.
		case unlock.MatchString(sql):
			c.report(call.Pos(), PoolLock,
				"pg_advisory_unlock sent through a %s runs on whichever pooled session is free, usually not the one holding the lock: it returns false, the lock stays held by a connection idling in the pool, and no other replica can take it. "+
					"Take and release the lock on one pinned connection (pool.Acquire / db.Conn) and unlock through that connection before releasing it",
				pool)
		case sessionLock.MatchString(sql):
			c.report(call.Pos(), PoolLock,
				"session advisory lock taken through a %s: the lock belongs to whichever pooled session ran the statement, and that connection goes back to the pool still holding it, so the unlock (through the pool) usually lands on another session and does nothing, and other code reusing the connection silently holds the lock too. "+
					"Pin one connection (pool.Acquire / db.Conn), lock and unlock on it, and release it after the unlock",
				pool)
		case xactLock.MatchString(sql):
			c.report(call.Pos(), XactLock,
				"transaction advisory lock taken through a %s outside a transaction: the statement is its own transaction, so the lock is released as soon as it returns and protects nothing after it. "+
					"Begin a transaction, take the lock with tx, and do the guarded work in that transaction",
				pool)
		}
		return true
	})
}

func (c *checker) constString(e ast.Expr) (string, bool) {
	if tv, ok := c.pass.TypesInfo.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
		return constant.StringVal(tv.Value), true
	}
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident:
		// The one value given to a local variable (var q string does not count).
		if v := c.localVar(x); v != nil {
			var rhs []ast.Expr
			for _, d := range c.defs[v] {
				if d.kind != defZero {
					rhs = append(rhs, d.rhs)
				}
			}
			if len(rhs) == 1 && rhs[0] != nil {
				return c.constString(rhs[0])
			}
		}
	case *ast.CallExpr:
		// fmt.Sprintf("SELECT pg_advisory_unlock(%d)", key): the format.
		if fn, ok := typeutilCallee(c.pass.TypesInfo, x).(*types.Func); ok && fn.Pkg() != nil && fn.Pkg().Path() == "fmt" &&
			strings.HasPrefix(fn.Name(), "Sprint") && len(x.Args) > 0 {
			return c.constString(x.Args[0])
		}
	case *ast.BinaryExpr:
		// "SELECT pg_advisory_unlock(" + strconv.FormatInt(key, 10) + ")"
		if x.Op == token.ADD {
			l, lok := c.constString(x.X)
			r, rok := c.constString(x.Y)
			return l + "?" + r, lok || rok
		}
	}
	return "", false
}
