package idemvet

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/tools/go/ast/astutil"
)

var (
	stripeRoot = regexp.MustCompile(`^github\.com/stripe/stripe-go(/v[0-9]+)?$`)
	stripeAny  = regexp.MustCompile(`^github\.com/stripe/stripe-go(/v[0-9]+)?(/.*)?$`)
)

// A sink is a place where a value becomes an idempotency key.
type sink struct {
	node    ast.Node // reported here
	key     ast.Expr
	how     string     // how the key is set, for messages
	request []ast.Expr // the other parts of the same request
}

// sinks returns every place in fd where a value becomes an idempotency key:
// a field named IdempotencyKey, SetIdempotencyKey, an Idempotency-Key header,
// or an argument of a function known to turn that argument into a key.
func (c *checker) sinks(fd *ast.FuncDecl) []sink {
	info := c.pass.TypesInfo
	var out []sink
	outer := map[*ast.CompositeLit]*ast.CompositeLit{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) != len(n.Rhs) {
				return true
			}
			for i, l := range n.Lhs {
				switch l := ast.Unparen(l).(type) {
				case *ast.SelectorExpr:
					if isKeyField(info, l) {
						out = append(out, sink{node: n.Rhs[i], key: n.Rhs[i], how: "IdempotencyKey", request: c.requestOf(fd, l.X)})
					}
				case *ast.IndexExpr: // req.Header["Idempotency-Key"] = []string{k}
					if isHeader(info.TypeOf(l.X)) && isKeyHeaderName(info, l.Index) {
						out = append(out, sink{node: n.Rhs[i], key: n.Rhs[i], how: "the Idempotency-Key header", request: c.requestOf(fd, l.X)})
					}
				}
			}
		case *ast.CompositeLit:
			// http.Header{"Idempotency-Key": {k}}, map[string]string{...}
			// handed to a client's SetHeaders.
			if _, ok := info.TypeOf(n).Underlying().(*types.Map); ok {
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isKeyHeaderName(info, kv.Key) {
						out = append(out, sink{node: kv.Value, key: kv.Value, how: "the Idempotency-Key header"})
					}
				}
				return true
			}
			// &XParams{Params: stripe.Params{IdempotencyKey: k}, Customer: c}:
			// the request is both literals' other fields.
			for _, el := range n.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if inner, ok := ast.Unparen(kv.Value).(*ast.CompositeLit); ok {
						outer[inner] = n
					}
				}
			}
			for _, el := range n.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "IdempotencyKey" {
					if v, ok := info.ObjectOf(id).(*types.Var); ok && v.IsField() {
						var req []ast.Expr
						for lit, skip := n, el; lit != nil; lit, skip = outer[lit], nil {
							for _, other := range lit.Elts {
								if other != el && other != skip {
									req = append(req, other)
								}
							}
						}
						out = append(out, sink{node: kv.Value, key: kv.Value, how: "IdempotencyKey", request: req})
					}
				}
			}
		case *ast.CallExpr:
			fn, _ := typeutilCallee(info, n).(*types.Func)
			if fn == nil {
				return true
			}
			sel, _ := ast.Unparen(n.Fun).(*ast.SelectorExpr)
			switch {
			case fn.Name() == "SetIdempotencyKey" && len(n.Args) == 1 && sel != nil:
				out = append(out, sink{node: n.Args[0], key: n.Args[0], how: "SetIdempotencyKey", request: c.requestOf(fd, sel.X)})
			case headerSetter.MatchString(fn.Name()) && len(n.Args) == 2 && sel != nil && isKeyHeaderName(info, n.Args[0]):
				// http.Header's Set and Add, resty's SetHeader, ...
				out = append(out, sink{node: n.Args[1], key: n.Args[1], how: "the Idempotency-Key header", request: c.requestOf(fd, sel.X)})
			default:
				for _, i := range c.keyParamsOf(fn) {
					if i < len(n.Args) {
						var req []ast.Expr
						for j, a := range n.Args {
							if j != i {
								req = append(req, a)
							}
						}
						out = append(out, sink{node: n.Args[i], key: n.Args[i],
							how: fmt.Sprintf("argument %d of %s, which becomes the idempotency key", i+1, shortName(fn)), request: req})
					}
				}
			}
		}
		return true
	})
	return out
}

var headerSetter = regexp.MustCompile(`^(Set|Add)(Header)?$`)

func isKeyField(info *types.Info, sel *ast.SelectorExpr) bool {
	s, ok := info.Selections[sel]
	return ok && s.Kind() == types.FieldVal && sel.Sel.Name == "IdempotencyKey"
}

func isHeader(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "net/http" && n.Obj().Name() == "Header"
}

func isKeyHeaderName(info *types.Info, e ast.Expr) bool {
	tv, ok := info.Types[e]
	return ok && tv.Value != nil && tv.Value.Kind() == constant.String &&
		strings.EqualFold(constant.StringVal(tv.Value), "Idempotency-Key")
}

// requestOf returns what else goes into the request whose key is set on x
// (params.IdempotencyKey, req.Header): the values x was built from and
// the values assigned to its other fields in fd.
func (c *checker) requestOf(fd *ast.FuncDecl, x ast.Expr) []ast.Expr {
	root := rootIdent(x)
	if root == nil {
		return nil
	}
	v := c.localVar(root)
	if v == nil {
		return []ast.Expr{x}
	}
	var out []ast.Expr
	for _, d := range c.defs[v] {
		if d.rhs != nil {
			out = append(out, d.rhs)
		}
	}
	if _, ok := c.params[v]; ok {
		out = append(out, root)
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return true
		}
		for i, l := range as.Lhs {
			if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name != "IdempotencyKey" {
				if r := rootIdent(sel.X); r != nil && c.pass.TypesInfo.ObjectOf(r) == v {
					// Field: value, as in a literal, so the field's name
					// is kept (see customerOf).
					out = append(out, &ast.KeyValueExpr{Key: sel.Sel, Colon: as.Rhs[i].Pos(), Value: as.Rhs[i]})
				}
			}
		}
		return true
	})
	return out
}

func rootIdent(e ast.Expr) *ast.Ident {
	for {
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			return x
		case *ast.SelectorExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.UnaryExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		default:
			return nil
		}
	}
}

func (c *checker) keyParamsOf(fn *types.Func) []int {
	if idx, ok := c.keyParam[fn]; ok {
		return idx
	}
	if fn.Pkg() == c.pass.Pkg {
		return nil
	}
	var f keyParams
	if c.pass.ImportObjectFact(fn.Origin(), &f) {
		return f.Index
	}
	return nil
}

// computeFacts finds, to a fixed point, the functions of this package that
// turn a parameter into a key, and those that return a new value per call.
func (c *checker) computeFacts() {
	for range 5 {
		changed := false
		for fn, fd := range c.decls {
			var params []*types.Var
			sig := fn.Type().(*types.Signature)
			for i := range sig.Params().Len() {
				params = append(params, sig.Params().At(i))
			}
			// A parameter that is the key by itself (possibly converted or
			// formatted), not one part of a key made from several.
			var idx []int
			for _, s := range c.sinks(fd) {
				only := -1
				c.trace(s.key, func(o origin) {
					i := -2
					if o.kind == oParam {
						i = slices.Index(params, o.v)
					}
					switch {
					case only == -1 && i >= 0:
						only = i
					case i != only:
						only = -2
					}
				})
				if only >= 0 && !slices.Contains(idx, only) {
					idx = append(idx, only)
				}
			}
			slices.Sort(idx)
			if len(idx) > 0 && !slices.Equal(idx, c.keyParam[fn]) {
				c.keyParam[fn] = idx
				changed = true
			}
			if _, done := c.freshFld[fn]; !done && returnsStruct(sig) {
				if m := c.freshFieldsOf(fd); len(m) > 0 {
					c.freshFld[fn] = m
					changed = true
				}
			}
			if !c.keyless[fn] && returnsParams(sig) && c.returnsKeyless(fd) {
				c.keyless[fn] = true
				changed = true
			}
			if _, done := c.fresh[fn]; !done && returnsIDLike(sig) {
				if src := c.freshReturn(fd); src != "" {
					c.fresh[fn] = src
					changed = true
				}
			}
		}
		if !changed {
			break
		}
	}
	// Only exported functions can be called from other packages.
	for fn, idx := range c.keyParam {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &keyParams{Index: idx})
		}
	}
	for fn := range c.keyless {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &keylessResult{})
		}
	}
	for fn, src := range c.fresh {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &freshResult{Source: src})
		}
	}
	for fn, m := range c.freshFld {
		// Other packages can read only exported fields.
		exp := map[string]string{}
		for f, src := range m {
			if token.IsExported(f) {
				exp[f] = src
			}
		}
		if fn.Exported() && len(exp) > 0 {
			c.pass.ExportObjectFact(fn, &freshFields{Source: exp})
		}
	}
}

func returnsStruct(sig *types.Signature) bool {
	if sig.Results().Len() == 0 {
		return false
	}
	t := sig.Results().At(0).Type()
	if p, ok := t.Underlying().(*types.Pointer); ok {
		t = p.Elem()
	}
	_, ok := t.Underlying().(*types.Struct)
	return ok
}

// freshFieldsOf returns the fields of the struct fd returns that are made
// from a random source or the clock: return T{Key: uuid.NewString()}.
func (c *checker) freshFieldsOf(fd *ast.FuncDecl) map[string]string {
	var m map[string]string
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) == 0 {
				return true
			}
			r := ast.Unparen(n.Results[0])
			if u, ok := r.(*ast.UnaryExpr); ok && u.Op == token.AND {
				r = ast.Unparen(u.X)
			}
			lit, ok := r.(*ast.CompositeLit)
			if !ok {
				return true
			}
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				id, ok := kv.Key.(*ast.Ident)
				if !ok {
					continue
				}
				c.trace(kv.Value, func(o origin) {
					if o.kind == oSource {
						if m == nil {
							m = map[string]string{}
						}
						if m[id.Name] == "" {
							m[id.Name] = o.desc
						}
					}
				})
			}
		}
		return true
	})
	return m
}

// freshField reports whether the field read sel is a field made from a
// random source by the function that built its struct: op.Key after
// op := NewOp(...). It returns a description and where the call is.
func (c *checker) freshField(sel *ast.SelectorExpr) (string, token.Pos) {
	var calls []*ast.CallExpr
	switch x := ast.Unparen(sel.X).(type) {
	case *ast.CallExpr:
		calls = append(calls, x)
	case *ast.Ident:
		if v := c.localVar(x); v != nil {
			for _, d := range c.defs[v] {
				if call, ok := ast.Unparen(d.rhs).(*ast.CallExpr); ok {
					calls = append(calls, call)
				}
			}
		}
	}
	for _, call := range calls {
		fn, ok := typeutilCallee(c.pass.TypesInfo, call).(*types.Func)
		if !ok || fn.Pkg() == nil {
			continue
		}
		m := c.freshFld[fn]
		if m == nil && fn.Pkg() != c.pass.Pkg {
			var f freshFields
			if c.pass.ImportObjectFact(fn.Origin(), &f) {
				m = f.Source
			}
		}
		if src := m[sel.Sel.Name]; src != "" {
			return shortName(fn) + "() (which returns " + src + " in " + sel.Sel.Name + ")", call.Pos()
		}
	}
	return "", token.NoPos
}

// returnsIDLike reports whether the first result could be an id or key:
// a string, a number, bytes or an array (a UUID), not a struct.
func returnsIDLike(sig *types.Signature) bool {
	if sig.Results().Len() == 0 {
		return false
	}
	switch u := sig.Results().At(0).Type().Underlying().(type) {
	case *types.Basic:
		return u.Info()&(types.IsString|types.IsInteger) != 0
	case *types.Array:
		return true
	case *types.Slice:
		b, ok := u.Elem().Underlying().(*types.Basic)
		return ok && b.Kind() == types.Byte
	}
	return false
}

func (c *checker) freshReturn(fd *ast.FuncDecl) string {
	src := ""
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) > 0 && src == "" {
				c.trace(n.Results[0], func(o origin) {
					if o.kind == oSource && src == "" {
						src = o.desc
					}
				})
			}
		}
		return true
	})
	return src
}

// ---- retry boundaries ----

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
	loop     bool
}

var retryPkgHint = regexp.MustCompile(`(?i)(retry|backoff|retrier|matryer/try|failsafe|apimachinery/pkg/util/wait)`)

// retryHelper returns the name of the retry helper call calls, or "".
func (c *checker) retryHelper(call *ast.CallExpr) string {
	fn, ok := typeutilCallee(c.pass.TypesInfo, call).(*types.Func)
	if !ok || fn.Pkg() == nil {
		return ""
	}
	path := fn.Pkg().Path()
	last := path[strings.LastIndex(path, "/")+1:]
	if regexp.MustCompile(`^v[0-9]+$`).MatchString(last) {
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
	var bodies []ast.Node
	var helperOf = map[ast.Node]string{}
	for _, f := range c.pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			if fd, ok := n.(*ast.FuncDecl); ok && isRoundTrip(info, fd) {
				bodies = append(bodies, fd.Body)
				helperOf[fd.Body] = "an http.RoundTripper"
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			h := c.retryHelper(call)
			if h == "" {
				return true
			}
			for _, a := range call.Args {
				switch a := ast.Unparen(a).(type) {
				case *ast.FuncLit:
					bodies = append(bodies, a.Body)
					helperOf[a.Body] = h
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
							for _, d := range c.defs[o] {
								if fl, ok := d.rhs.(*ast.FuncLit); ok {
									bodies = append(bodies, fl.Body)
									helperOf[fl.Body] = h
								}
							}
						}
					case *types.Func:
						if fd := c.decls[o]; fd != nil {
							c.retriedFuncs[o] = h
							bodies = append(bodies, fd.Body)
							helperOf[fd.Body] = h
						}
					}
				}
			}
			return true
		})
	}
	// Functions of this package called from a retried body run once per
	// attempt too (two levels deep).
	for range 2 {
		var next []ast.Node
		for _, b := range bodies {
			h := helperOf[b]
			ast.Inspect(b, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				switch o := typeutilCallee(info, call).(type) {
				case *types.Func:
					if fd := c.decls[o]; fd != nil && c.retriedFuncs[o] == "" {
						c.retriedFuncs[o] = h
						next = append(next, fd.Body)
						helperOf[fd.Body] = h
					}
				case *types.Var:
					if _, ok := c.defs[o]; ok && c.retriedVars[o] == "" {
						c.retriedVars[o] = h
						for _, d := range c.defs[o] {
							if fl, ok := d.rhs.(*ast.FuncLit); ok {
								next = append(next, fl.Body)
								helperOf[fl.Body] = h
							}
						}
					}
				}
				return true
			})
		}
		bodies = next
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

// boundaries returns the retry boundaries enclosing pos, innermost first.
func (c *checker) boundaries(f *ast.File, pos token.Pos) []boundary {
	info := c.pass.TypesInfo
	path, _ := astutil.PathEnclosingInterval(f, pos, pos)
	var out []boundary
	for i, n := range path {
		var parent ast.Node
		if i+1 < len(path) {
			parent = path[i+1]
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			h := ""
			direct := false
			switch p := parent.(type) {
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
							if v, ok := info.Defs[name].(*types.Var); ok {
								if bt, ok := v.Type().Underlying().(*types.Basic); ok && bt.Info()&types.IsInteger != 0 {
									b.attemptNo[v] = true
								}
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
				if changed, ok := c.selfRetry(fn, n); ok {
					b := boundary{node: n, from: n.Pos(), to: n.End(), passVars: changed, attemptNo: map[*types.Var]bool{},
						what: n.Name.Name + " calls itself again after an error"}
					for v := range changed {
						if bt, ok := v.Type().Underlying().(*types.Basic); ok && bt.Info()&types.IsInteger != 0 {
							b.attemptNo[v] = true
						}
					}
					out = append(out, b)
				}
			}
		case *ast.ForStmt:
			if c.isRetryLoop(n, n.Cond, n.Body) {
				from := n.Pos()
				if n.Init != nil {
					from = n.Init.End()
				}
				out = append(out, boundary{node: n, from: from, to: n.End(), loop: true, passVars: c.forVars(n),
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
			if counted && c.isRetryLoop(n, nil, n.Body) {
				vars := map[*types.Var]bool{}
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						if v := c.localVar(id); v != nil {
							vars[v] = true
						}
					}
				}
				out = append(out, boundary{node: n, from: n.Pos(), to: n.End(), loop: true, passVars: vars,
					what: "the loop at line " + fmt.Sprint(c.pass.Fset.Position(n.Pos()).Line) + " repeats the request after an error"})
			}
		}
	}
	return out
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

// selfRetry reports whether fd retries by calling itself: it calls itself
// and tests an error. It returns the parameters the call changes.
func (c *checker) selfRetry(fn *types.Func, fd *ast.FuncDecl) (map[*types.Var]bool, bool) {
	info := c.pass.TypesInfo
	var params []*types.Var
	sig := fn.Type().(*types.Signature)
	for i := range sig.Params().Len() {
		params = append(params, sig.Params().At(i))
	}
	self, testsErr := false, false
	changed := map[*types.Var]bool{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if typeutilCallee(info, n) != fn {
				return true
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
		return true
	})
	return changed, self && testsErr
}

// isRetryLoop reports whether a loop repeats after an error: it stops on
// success (if err == nil { return/break }), continues on an error
// (if err != nil { continue }), or loops while an error is set. A loop
// whose condition uses len() walks a collection and is not one.
func (c *checker) isRetryLoop(loop ast.Node, cond ast.Expr, body *ast.BlockStmt) bool {
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

func isNil(e ast.Expr) bool {
	id, ok := ast.Unparen(e).(*ast.Ident)
	return ok && id.Name == "nil"
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
