package ctxfold

import (
	"container/list"
	"sync"
)

// defaultViewCacheSessions is how many sessions' last views a Client keeps for deltas.
const defaultViewCacheSessions = 256

// cachedView is the last whole view of one session.
type cachedView struct {
	sessionID string
	view      *View
}

// viewCache holds the last whole view of the most recently used sessions (least recently used
// evicted), shared by every Session handle of a Client. A miss only costs a whole view.
type viewCache struct {
	mu       sync.Mutex
	capacity int
	order    *list.List // front = most recently used; values are *cachedView
	entries  map[string]*list.Element
}

func newViewCache(capacity int) *viewCache {
	return &viewCache{capacity: capacity, order: list.New(), entries: map[string]*list.Element{}}
}

// get returns the held view of a session (nil when none) and marks it used.
func (c *viewCache) get(sessionID string) *View {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[sessionID]
	if !ok {
		return nil
	}
	c.order.MoveToFront(el)
	return el.Value.(*cachedView).view
}

// put holds a session's whole view, evicting the least recently used session when full.
func (c *viewCache) put(sessionID string, view *View) {
	if c.capacity <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[sessionID]; ok {
		el.Value = &cachedView{sessionID, view}
		c.order.MoveToFront(el)
		return
	}
	c.entries[sessionID] = c.order.PushFront(&cachedView{sessionID, view})
	if c.order.Len() > c.capacity {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*cachedView).sessionID)
	}
}

// forget drops a session's view (after Rewind or Delete, whose next view shares no prefix).
func (c *viewCache) forget(sessionID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[sessionID]; ok {
		c.order.Remove(el)
		delete(c.entries, sessionID)
	}
}
