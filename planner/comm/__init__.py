"""Where ranks sit and what they send: placement on the cluster's tiers, collective times
(alpha-beta over the tiers a group crosses), the collectives of one step per axis and how
much of each is exposed, links shared by several axes."""
