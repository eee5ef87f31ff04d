package idemvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/ast/edge"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// This file finds code that runs once per attempt of one operation: the
// retry boundaries that retrykey reports keys inside of, and that freshkey
// needs to be absent.

// A boundary is code that runs once per attempt of one operation.
type boundary struct {
	node      ast.Node
	from, to  token.Pos
	what      string              // "the function passed to backoff.Retry", ...
	attemptNo map[*types.Var]bool // parameters carrying the attempt number
	// passVars change from one pass to the next (a loop's counter, a
	// parameter changed by a recursive call): a request made from them is
	// a new request on every pass, so the code walks a collection rather
	// than retrying one request.
	passVars map[*types.Var]bool
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

var (
	retryPkgHint = regexp.MustCompile(`(?i)(retry|backoff|retrier|matryer/try|failsafe|apimachinery/pkg/util/wait)`)
	majorVersion = regexp.MustCompile(`^v[0-9]+$`)
)

// retryHelper returns the name of the retry helper call calls, or "".
func (c *checker) retryHelper(call *ast.CallExpr) string {
	fn, ok := typeutil.Callee(c.pass.TypesInfo, call).(*types.Func)
	if !ok || fn.Pkg() == nil {
		return ""
	}
	path := fn.Pkg().Path()
	last := path[strings.LastIndex(path, "/")+1:]
	if majorVersion.MatchString(last) {
		p := path[:strings.LastIndex(path, "/")]
		last = p[strings.LastIndex(p, "/")+1:]
	}
	if !retryPkgHint.MatchString(last) && !retryPkgHint.MatchString(path) {
		return ""
	}
	// A call that takes a function: the operation to retry.
	for _, a := range call.Args {
		if _, ok := c.pass.TypesInfo.TypeOf(a).Underlying().(*types.Signature); ok {
			return shortName(fn)
		}
	}
	return ""
}

// findRetried records the functions and function variables passed to a
// retry helper, and the functions of this package they call.
func (c *checker) findRetried() {
	info := c.pass.TypesInfo
	var bodies []inspector.Cursor
	helperOf := map[ast.Node]string{}
	retried := func(body inspector.Cursor, h string) {
		bodies = append(bodies, body)
		helperOf[body.Node()] = h
	}
	// litBodies calls retried for the function literals assigned to v.
	litBodies := func(v *types.Var, h string) {
		for _, d := range c.defs[v] {
			if fl, ok := d.rhs.(*ast.FuncLit); ok {
				if cur, ok := c.insp.Root().FindNode(fl); ok {
					retried(cur.ChildAt(edge.FuncLit_Body, -1), h)
				}
			}
		}
	}
	for cur := range c.insp.Root().Preorder((*ast.FuncDecl)(nil), (*ast.CallExpr)(nil)) {
		switch n := cur.Node().(type) {
		case *ast.FuncDecl:
			if isRoundTrip(info, n) {
				retried(bodyOf(cur), "an http.RoundTripper")
			}
		case *ast.CallExpr:
			h := c.retryHelper(n)
			if h == "" {
				continue
			}
			for i, a := range n.Args {
				switch a := ast.Unparen(a).(type) {
				case *ast.FuncLit:
					if lit, ok := cur.ChildAt(edge.CallExpr_Args, i).FindNode(a); ok {
						retried(lit.ChildAt(edge.FuncLit_Body, -1), h)
					}
				case *ast.Ident, *ast.SelectorExpr:
					var id *ast.Ident
					if s, ok := a.(*ast.SelectorExpr); ok {
						id = s.Sel
					} else {
						id = a.(*ast.Ident)
					}
					switch o := info.ObjectOf(id).(type) {
					case *types.Var:
						if c.localVar(id) != nil {
							c.retriedVars[o] = h
							litBodies(o, h)
						}
					case *types.Func:
						if fdc, ok := c.decls[o]; ok {
							c.retriedFuncs[o] = h
							retried(bodyOf(fdc), h)
						}
					}
				}
			}
		}
	}
	// Functions of this package called from a retried body run once per
	// attempt too (two levels deep).
	for range 2 {
		prev := bodies
		bodies = nil
		for _, b := range prev {
			h := helperOf[b.Node()]
			for cur := range b.Preorder((*ast.CallExpr)(nil)) {
				switch o := typeutil.Callee(info, cur.Node().(*ast.CallExpr)).(type) {
				case *types.Func:
					if fdc, ok := c.decls[o]; ok && c.retriedFuncs[o] == "" {
						c.retriedFuncs[o] = h
						retried(bodyOf(fdc), h)
					}
				case *types.Var:
					if _, ok := c.defs[o]; ok && c.retriedVars[o] == "" {
						c.retriedVars[o] = h
						litBodies(o, h)
					}
				}
			}
		}
	}
}

func isRoundTrip(info *types.Info, fd *ast.FuncDecl) bool {
	if fd.Recv == nil || fd.Name.Name != "RoundTrip" {
		return false
	}
	fn, ok := info.Defs[fd.Name].(*types.Func)
	if !ok {
		return false
	}
	sig := fn.Type().(*types.Signature)
	return sig.Params().Len() == 1 && types.TypeString(sig.Params().At(0).Type(), nil) == "*net/http.Request"
}

// boundaries returns the retry boundaries enclosing cur, innermost first.
func (c *checker) boundaries(cur inspector.Cursor) []boundary {
	info := c.pass.TypesInfo
	var out []boundary
	for e := range cur.Enclosing((*ast.FuncLit)(nil), (*ast.FuncDecl)(nil), (*ast.ForStmt)(nil), (*ast.RangeStmt)(nil)) {
		switch n := e.Node().(type) {
		case *ast.FuncLit:
			h := ""
			direct := false
			switch p := e.Parent().Node().(type) {
			case *ast.CallExpr:
				if h = c.retryHelper(p); h != "" {
					direct = true
				}
			case *ast.AssignStmt:
				for j, r := range p.Rhs {
					if r == n && j < len(p.Lhs) {
						if id, ok := p.Lhs[j].(*ast.Ident); ok {
							if v, ok := info.ObjectOf(id).(*types.Var); ok {
								h = c.retriedVars[v]
							}
						}
					}
				}
			case *ast.ValueSpec:
				for j, r := range p.Values {
					if r == n && j < len(p.Names) {
						if v, ok := info.ObjectOf(p.Names[j]).(*types.Var); ok {
							h = c.retriedVars[v]
						}
					}
				}
			}
			if h != "" {
				b := boundary{node: n, from: n.Pos(), to: n.End(), what: "this function literal runs once per attempt of " + h}
				if direct {
					b.attemptNo = map[*types.Var]bool{}
					for _, fl := range n.Type.Params.List {
						for _, name := range fl.Names {
							if v, ok := info.Defs[name].(*types.Var); ok && isInteger(v.Type()) {
								b.attemptNo[v] = true
							}
						}
					}
				}
				out = append(out, b)
			}
		case *ast.FuncDecl:
			fn, _ := info.Defs[n.Name].(*types.Func)
			switch {
			case isRoundTrip(info, n):
				out = append(out, boundary{node: n, from: n.Pos(), to: n.End(),
					what: "RoundTrip runs once per attempt of every retrying transport or client above it (stripe-go's own retries included)"})
			case fn != nil && c.retriedFuncs[fn] != "":
				out = append(out, boundary{node: n, from: n.Pos(), to: n.End(),
					what: n.Name.Name + " runs once per attempt of " + c.retriedFuncs[fn]})
			case fn != nil:
				if changed, ok := c.selfRetry(fn, e); ok {
					b := boundary{node: n, from: n.Pos(), to: n.End(), passVars: changed, attemptNo: map[*types.Var]bool{},
						what: n.Name.Name + " calls itself again after an error"}
					for v := range changed {
						if isInteger(v.Type()) {
							b.attemptNo[v] = true
						}
					}
					out = append(out, b)
				}
			}
		case *ast.ForStmt:
			if c.isRetryLoop(n.Cond, n.Body) {
				from := n.Pos()
				if n.Init != nil {
					from = n.Init.End()
				}
				out = append(out, boundary{node: n, from: from, to: n.End(), passVars: c.forVars(n),
					what: "the loop at line " + fmt.Sprint(c.pass.Fset.Position(n.Pos()).Line) + " repeats the request after an error"})
			}
		case *ast.RangeStmt:
			// range 3, range ticker.C: passes of one operation (a range
			// over a collection is a walk, see fixedkey).
			counted := false
			switch t := info.TypeOf(n.X).Underlying().(type) {
			case *types.Basic:
				counted = t.Info()&types.IsInteger != 0
			case *types.Chan:
				counted = true
			}
			if counted && c.isRetryLoop(nil, n.Body) {
				vars := map[*types.Var]bool{}
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						if v := c.localVar(id); v != nil {
							vars[v] = true
						}
					}
				}
				out = append(out, boundary{node: n, from: n.Pos(), to: n.End(), passVars: vars,
					what: "the loop at line " + fmt.Sprint(c.pass.Fset.Position(n.Pos()).Line) + " repeats the request after an error"})
			}
		}
	}
	return out
}

func isInteger(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsInteger != 0
}

// forVars returns the variables a for loop's init declares and its post
// statement changes.
func (c *checker) forVars(n *ast.ForStmt) map[*types.Var]bool {
	vars := map[*types.Var]bool{}
	add := func(e ast.Expr) {
		if id, ok := ast.Unparen(e).(*ast.Ident); ok {
			if v := c.localVar(id); v != nil {
				vars[v] = true
			}
		}
	}
	for _, st := range []ast.Stmt{n.Init, n.Post} {
		switch st := st.(type) {
		case *ast.AssignStmt:
			for _, l := range st.Lhs {
				add(l)
			}
		case *ast.IncDecStmt:
			add(st.X)
		}
	}
	return vars
}

// selfRetry reports whether the function fn declared at fdc retries by
// calling itself: it calls itself and tests an error. It returns the
// parameters the call changes.
func (c *checker) selfRetry(fn *types.Func, fdc inspector.Cursor) (map[*types.Var]bool, bool) {
	info := c.pass.TypesInfo
	var params []*types.Var
	sig := fn.Type().(*types.Signature)
	for i := range sig.Params().Len() {
		params = append(params, sig.Params().At(i))
	}
	self, testsErr := false, false
	changed := map[*types.Var]bool{}
	for cur := range bodyOf(fdc).Preorder((*ast.CallExpr)(nil), (*ast.IfStmt)(nil)) {
		switch n := cur.Node().(type) {
		case *ast.CallExpr:
			if typeutil.Callee(info, n) != fn {
				continue
			}
			self = true
			for i, a := range n.Args {
				if i >= len(params) || sig.Variadic() && i >= len(params)-1 {
					break
				}
				if id, ok := ast.Unparen(a).(*ast.Ident); !ok || info.Uses[id] != params[i] {
					changed[params[i]] = true
				}
			}
		case *ast.IfStmt:
			if c.mentionsError(n.Cond) {
				testsErr = true
			}
		}
	}
	return changed, self && testsErr
}

// isRetryLoop reports whether a loop repeats after an error: it stops on
// success (if err == nil { return/break }), continues on an error
// (if err != nil { continue }), or loops while an error is set. A loop
// whose condition uses len() walks a collection and is not one.
func (c *checker) isRetryLoop(cond ast.Expr, body *ast.BlockStmt) bool {
	if cond != nil {
		usesLen := false
		ast.Inspect(cond, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "len" {
					usesLen = true
				}
			}
			return true
		})
		if usesLen {
			return false
		}
		if c.mentionsError(cond) {
			return true
		}
	}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit, *ast.ForStmt, *ast.RangeStmt:
			return false // a nested loop retries for itself
		case *ast.SwitchStmt:
			// switch { case err == nil: break attempts }: an unlabelled
			// break in a case leaves the switch only.
			if n.Tag != nil {
				return true
			}
			for _, cc := range n.Body.List {
				for _, e := range cc.(*ast.CaseClause).List {
					if c.errCompare(e, token.EQL) && exitsNested(cc) || c.mentionsError(e) && hasContinue(cc) {
						found = true
					}
				}
			}
		case *ast.IfStmt:
			switch {
			case c.errCompare(n.Cond, token.EQL) && exits(n.Body):
				found = true
			case c.errCompare(n.Cond, token.NEQ) && n.Else != nil && exits(n.Else):
				found = true
			case c.mentionsError(n.Cond) && hasContinue(n.Body):
				found = true
			}
		}
		return !found
	})
	return found
}

var errorType = types.Universe.Lookup("error").Type()

func (c *checker) isError(e ast.Expr) bool {
	t := c.pass.TypesInfo.TypeOf(e)
	return t != nil && types.Identical(t, errorType)
}

func (c *checker) mentionsError(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if x, ok := n.(ast.Expr); ok && c.isError(x) {
			found = true
		}
		return !found
	})
	return found
}

// errCompare reports whether cond contains err op nil.
func (c *checker) errCompare(cond ast.Expr, op token.Token) bool {
	found := false
	ast.Inspect(cond, func(n ast.Node) bool {
		if b, ok := n.(*ast.BinaryExpr); ok && b.Op == op {
			if (c.isError(b.X) && isNil(b.Y)) || (c.isError(b.Y) && isNil(b.X)) {
				found = true
			}
		}
		return !found
	})
	return found
}

// exits reports whether n leaves the loop: a return, or a break that is
// not inside a nested switch, select or loop.
func exits(n ast.Node) bool { return exitsFrom(n, false) }

// exitsNested is exits for code inside a switch or select: only a return
// or a labelled break leaves the loop.
func exitsNested(n ast.Node) bool { return exitsFrom(n, true) }

func exitsFrom(n ast.Node, nested0 bool) bool {
	found := false
	var walk func(n ast.Node, nested bool)
	walk = func(n ast.Node, nested bool) {
		ast.Inspect(n, func(m ast.Node) bool {
			switch m := m.(type) {
			case *ast.FuncLit:
				return false
			case *ast.ReturnStmt:
				found = true
			case *ast.BranchStmt:
				if m.Tok == token.BREAK && (!nested || m.Label != nil) {
					found = true
				}
			case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt, *ast.ForStmt, *ast.RangeStmt:
				if m != n {
					walk(m, true)
					return false
				}
			}
			return true
		})
	}
	walk(n, nested0)
	return found
}

func hasContinue(n ast.Node) bool {
	found := false
	ast.Inspect(n, func(m ast.Node) bool {
		switch m := m.(type) {
		case *ast.FuncLit, *ast.ForStmt, *ast.RangeStmt:
			return false
		case *ast.BranchStmt:
			if m.Tok == token.CONTINUE {
				found = true
			}
		}
		return true
	})
	return found
}
