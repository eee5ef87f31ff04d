package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// This file reports stripe-go writes without an idempotency key (nokey).

// writeMethod names the writes checked: creations and the steps that move
// money or an invoice on (an invoice's lines, finalize, pay, send, void).
var writeMethod = regexp.MustCompile(`^(New|Create|Confirm|Pay|Capture|Increment.*|AddLines|FinalizeInvoice|SendInvoice|VoidInvoice)$`)

// moneyPkgs are the stripe-go resources whose duplicate moves or bills
// money: a second charge, invoice, subscription, usage record, refund,
// transfer or payout, a line added twice, usage counted twice or a meter
// event cancelled twice. A duplicate token, customer, webhook endpoint or
// checkout session is clutter, not a double charge; -allwrites reports
// writes of every resource.
var moneyPkgs = map[string]bool{
	"charge": true, "paymentintent": true, "invoice": true, "invoiceitem": true,
	"subscription": true, "subscriptionitem": true, "subscriptionschedule": true,
	"usagerecord": true, "meterevent": true, "metereventadjustment": true,
	"refund": true, "creditnote": true,
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

func (c *checker) checkWrites(fdc inspector.Cursor) {
	info := c.pass.TypesInfo
	for cur := range bodyOf(fdc).Preorder((*ast.CallExpr)(nil)) {
		call := cur.Node().(*ast.CallExpr)
		fn, ok := typeutil.Callee(info, call).(*types.Func)
		if !ok || fn.Pkg() == nil || !writeMethod.MatchString(fn.Name()) {
			continue
		}
		res := writeResource(fn)
		if res == "" {
			continue
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
			if c.lacksKey(fdc, cur, a) {
				c.report(cur, NoKey,
					"%s sends a Stripe write without an idempotency key: stripe-go then makes a random key for this call only, so any retry around it (a job rerun, a queue redelivery, a retry loop, a restart) makes a second %s. "+
						"Set params.IdempotencyKey from what identifies the operation (customer, period: idemkey.For)",
					types.ExprString(call.Fun), res+" object")
			}
		}
	}
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

// lacksKey reports whether the params a of the write call (or return
// statement) at call, in the function declared at fdc, are sure to carry
// no key: nil, a literal without one, or a local variable built from such
// a literal that gets no key and is handed to no other code before the
// write.
func (c *checker) lacksKey(fdc, call inspector.Cursor, a ast.Expr) bool {
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
				if b, ok := typeutil.Callee(c.pass.TypesInfo, call).(*types.Builtin); ok && b.Name() == "new" {
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
		return !c.mayGetKey(fdc, call, v)
	}
	return false
}

// keylessCall reports whether call is to a function that builds params
// without a key (keylessResult).
func (c *checker) keylessCall(call *ast.CallExpr) bool {
	fn, ok := typeutil.Callee(c.pass.TypesInfo, call).(*types.Func)
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

// returnsKeyless reports whether every return of the function declared at
// fdc gives params sure to carry no key.
func (c *checker) returnsKeyless(fdc inspector.Cursor) bool {
	rets := returnsOf(fdc)
	for _, cur := range rets {
		ret := cur.Node().(*ast.ReturnStmt)
		if len(ret.Results) == 0 || !c.lacksKey(fdc, cur, ret.Results[0]) {
			return false
		}
	}
	return len(rets) > 0
}

// runsBefore reports whether code at pos may run before the write call in
// the function declared at fdc: it comes first, or shares a loop with the
// call, or the function jumps backwards.
func runsBefore(fdc, call inspector.Cursor, pos token.Pos) bool {
	if pos < call.Node().Pos() {
		return true
	}
	for e := range call.Enclosing((*ast.FuncLit)(nil), (*ast.ForStmt)(nil), (*ast.RangeStmt)(nil)) {
		if _, lit := e.Node().(*ast.FuncLit); lit != within(e.Node(), pos) {
			// A write in a function literal runs when the literal is
			// called, maybe after code that follows it; a loop holding
			// both runs them in turn.
			return true
		}
	}
	for cur := range bodyOf(fdc).Preorder((*ast.BranchStmt)(nil)) {
		if cur.Node().(*ast.BranchStmt).Tok == token.GOTO {
			return true
		}
	}
	return false
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

// mayGetKey reports whether v's key may be set in the function declared at
// fdc before the write call, or v leaves the function's sight before it:
// any use other than reading or writing a field, calling a stripe-go
// method with it, or a stripe-go write.
func (c *checker) mayGetKey(fdc, call inspector.Cursor, v *types.Var) bool {
	info := c.pass.TypesInfo
	for cur := range bodyOf(fdc).Preorder((*ast.Ident)(nil)) {
		id := cur.Node().(*ast.Ident)
		if info.Uses[id] != v || !runsBefore(fdc, call, id.Pos()) {
			continue
		}
		switch p := cur.Parent().Node().(type) {
		case *ast.SelectorExpr:
			switch p.Sel.Name {
			case "IdempotencyKey", "SetIdempotencyKey":
				return true
			case "Params":
				// p.Params.IdempotencyKey, p.Params = ...: look at the next selector.
				if gp, ok := cur.Parent().Parent().Node().(*ast.SelectorExpr); !ok || gp.Sel.Name == "IdempotencyKey" || gp.Sel.Name == "SetIdempotencyKey" {
					return true
				}
			}
		case *ast.CallExpr:
			fn, ok := typeutil.Callee(info, p).(*types.Func)
			if !ok || fn.Pkg() == nil || !stripeAny.MatchString(fn.Pkg().Path()) {
				return true
			}
		case *ast.AssignStmt:
			for _, r := range p.Rhs {
				if r == id {
					return true // copied elsewhere
				}
			}
		default:
			return true
		}
	}
	return false
}
