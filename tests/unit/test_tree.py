"""A chat as a tree of messages (storage/tree.py), pure: branches, siblings, the current branch's end, and chats
stored before the tree read as one branch."""

from storage.ids import new_id
from storage.tree import ROOT_ID, ancestors, before, branch, children, leaf, parents


def ids(n: int) -> list[str]:
    return [str(new_id()) for _ in range(n)]


def test_an_old_chat_without_parents_is_one_branch_in_time_order():
    q1, a1, q2, a2 = ids(4)
    parent_of = parents([(q1, None, "user"), (a1, None, "assistant"), (q2, None, "user"), (a2, None, "assistant")])
    assert parent_of == {q1: ROOT_ID, a1: q1, q2: a1, a2: q2}
    assert branch(parent_of, None) == [q1, a1, q2, a2]


def test_an_edited_question_and_a_regenerated_answer_make_siblings_and_both_branches_stay_reachable():
    q1, a1, q2, a2, q2b, a2b, a2c = ids(7)
    rows = [
        (q1, ROOT_ID, "user"),
        (a1, q1, "assistant"),
        (q2, a1, "user"),
        (a2, q2, "assistant"),
        (q2b, a1, "user"),  # the second question edited and sent again: a sibling of q2
        (a2b, q2b, "assistant"),
        (a2c, q2b, "assistant"),  # its answer regenerated: a sibling of a2b
    ]
    parent_of = parents(rows)
    kids = children(parent_of)
    assert kids[a1] == [q2, q2b] and kids[q2b] == [a2b, a2c] and kids[ROOT_ID] == [q1]
    assert branch(parent_of, None) == [q1, a1, q2b, a2c]  # the newest message's branch
    assert branch(parent_of, q2) == [q1, a1, q2, a2]  # the old branch, by any of its messages
    assert branch(parent_of, a2b) == [q1, a1, q2b, a2b]
    assert leaf(kids, a1) == a2c and leaf(kids, q2) == a2
    assert before(rows, a2) == {q1, a1, q2, a2} and q2b not in before(rows, a2)
    assert ancestors(parent_of, "not-stored") == []


def test_a_new_first_message_is_a_second_root():
    q1, a1, r2, b2 = ids(4)
    parent_of = parents([(q1, ROOT_ID, "user"), (a1, q1, "assistant"), (r2, ROOT_ID, "user"), (b2, r2, "assistant")])
    assert children(parent_of)[ROOT_ID] == [q1, r2]
    assert branch(parent_of, None) == [r2, b2] and branch(parent_of, a1) == [q1, a1]


def test_a_message_whose_parent_was_never_stored_follows_the_one_before_it():
    # a1's run was withdrawn (its edge died): q2 names it, yet the branch runs through q1 and a0 to q2
    q0, a0, q1, a1, q2, a2 = (str(new_id()) for _ in range(6))
    rows = [(q0, ROOT_ID, "user"), (a0, q0, "assistant"), (q1, a0, "user"), (q2, a1, "user"), (a2, q2, "assistant")]
    parent_of = parents(rows)
    assert parent_of[q2] == q1
    assert branch(parent_of, None) == [q0, a0, q1, q2, a2]
    assert before(rows, q2) == {q0, a0, q1, q2}
