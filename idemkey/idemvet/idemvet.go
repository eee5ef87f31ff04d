package idemvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Report categories, one per rule. Each rule lives in the file of its name
// (xactlock in poollock.go); the helpers they share are in trace.go
// (where a value comes from), keys.go (where a value becomes a key),
// attempts.go (code that runs once per attempt) and facts.go (what one
// package tells the packages that import it).
const (
	RetryKey = "retrykey"
	FreshKey = "freshkey"
	FixedKey = "fixedkey"
	NoKey    = "nokey"
	PoolLock = "poollock"
	XactLock = "xactlock"
)

// Analyzer reports the code patterns that make Stripe (or any API keyed by
// an Idempotency-Key) charge a customer twice. See the package
// documentation for each report and how to silence a deliberate case.
var Analyzer = &analysis.Analyzer{
	Name:      "idemvet",
	Doc:       "report idempotency keys that change between attempts, keys shared by different operations, Stripe writes without a key, and advisory locks taken or released through a connection pool",
	URL:       "https://pkg.go.dev/github.com/billonce/billonce/idemkey/idemvet",
	Requires:  []*analysis.Analyzer{inspect.Analyzer},
	Run:       run,
	FactTypes: []analysis.Fact{new(keyParams), new(freshResult), new(freshFields), new(keylessResult)},
}

// checker holds what run learns about one package.
type checker struct {
	pass     *analysis.Pass
	insp     *inspector.Inspector
	decls    map[*types.Func]inspector.Cursor // -> its *ast.FuncDecl
	defs     map[*types.Var][]def
	params   map[*types.Var]ast.Node // -> the *ast.FuncDecl or *ast.FuncLit declaring it
	keyParam map[*types.Func][]int
	fresh    map[*types.Func]string
	freshFld map[*types.Func]map[string]string
	keyless  map[*types.Func]bool
	// retried holds functions and function-valued variables that run once
	// per attempt: passed to a retry helper, or called from such a
	// function.
	retriedFuncs map[*types.Func]string // -> name of the retry helper
	retriedVars  map[*types.Var]string
	ignores      map[string]map[int]string // file name -> line -> reason
	reported     map[token.Pos]bool
}

func run(pass *analysis.Pass) (any, error) {
	c := &checker{
		pass:         pass,
		insp:         pass.ResultOf[inspect.Analyzer].(*inspector.Inspector),
		decls:        map[*types.Func]inspector.Cursor{},
		defs:         map[*types.Var][]def{},
		params:       map[*types.Var]ast.Node{},
		keyParam:     map[*types.Func][]int{},
		fresh:        map[*types.Func]string{},
		freshFld:     map[*types.Func]map[string]string{},
		keyless:      map[*types.Func]bool{},
		retriedFuncs: map[*types.Func]string{},
		retriedVars:  map[*types.Var]string{},
		ignores:      map[string]map[int]string{},
		reported:     map[token.Pos]bool{},
	}
	c.readIgnores()
	var funcs []inspector.Cursor
	for fdc := range c.insp.Root().Preorder((*ast.FuncDecl)(nil)) {
		fd := fdc.Node().(*ast.FuncDecl)
		if fd.Body == nil {
			continue
		}
		if fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func); ok {
			c.decls[fn] = fdc
		}
		c.collectDefs(fdc)
		funcs = append(funcs, fdc)
	}
	c.computeFacts()
	c.findRetried()
	for _, fdc := range funcs {
		c.checkKeys(fdc)
		c.checkWrites(fdc)
		c.checkLocks(fdc)
	}
	return nil, nil
}

const ignoreHead = "//idemvet:ignore"

func (c *checker) readIgnores() {
	for _, f := range c.pass.Files {
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
}

// report reports at the node of cur, once per position, unless an
// //idemvet:ignore with a reason is on its line, the line above, or the
// line above the statement holding it.
func (c *checker) report(cur inspector.Cursor, category, format string, args ...any) {
	pos := cur.Node().Pos()
	if c.reported[pos] {
		return
	}
	c.reported[pos] = true
	msg := fmt.Sprintf(format, args...)
	p := c.pass.Fset.Position(pos)
	lines := []int{p.Line, p.Line - 1}
	for e := range cur.Enclosing() {
		if st, ok := e.Node().(ast.Stmt); ok {
			if _, block := st.(*ast.BlockStmt); !block {
				l := c.pass.Fset.Position(st.Pos()).Line
				lines = append(lines, l, l-1)
				break
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
