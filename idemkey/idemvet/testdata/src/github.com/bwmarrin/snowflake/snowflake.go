package snowflake

type ID int64
type Node struct{}

func NewNode(n int64) (*Node, error) { return &Node{}, nil }
func (n *Node) Generate() ID         { return 0 }
func (f ID) String() string          { return "" }
