// RowStore: rows found by id, across blocks, their contents where they
// were put, memory that grows a block at a time, frozen views that keep
// their rows while the store is written, and the rows written under each
// change mark.
#include "ps_server/core/row_store.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(RowStoreTest, RowsAreFoundByIdAndHoldWhatWasPutAcrossBlocks) {
  RowStore store(/*dim=*/2, /*slots_per_value=*/2);
  EXPECT_EQ(store.size(), 0);
  EXPECT_EQ(store.Find(5), -1);
  const int64_t rows = 2 * RowStore::kRowsPerBlock + 3;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t id = static_cast<uint64_t>(r) * 1000003;
    const float v = static_cast<float>(r);
    EXPECT_EQ(store.Add(id, std::vector<float>{v, -v}, std::vector<float>{1, 2, 3, v}, r + 1), r);
  }
  EXPECT_EQ(store.size(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(r);
    const uint64_t id = static_cast<uint64_t>(r) * 1000003;
    ASSERT_EQ(store.Find(id), r);
    EXPECT_EQ(store.id(r), id);
    const float v = static_cast<float>(r);
    EXPECT_EQ(std::vector<float>(store.values(r).begin(), store.values(r).end()),
              (std::vector<float>{v, -v}));
    EXPECT_EQ(std::vector<float>(store.slots(r).begin(), store.slots(r).end()),
              (std::vector<float>{1, 2, 3, v}));
    EXPECT_EQ(store.updates(r), r + 1);
  }
  EXPECT_EQ(store.Find(1), -1);
  store.Update(7, std::vector<float>{7, 42}, std::vector<float>{4, 3, 2, 1}, 9);
  EXPECT_EQ(store.values(7)[1], 42);
  EXPECT_EQ(store.slots(7)[0], 4);
  EXPECT_EQ(store.values(6)[1], -6);
  EXPECT_EQ(store.updates(7), 9);
}

// FindEach answers as Find does for each id, held or not, in the ids' order
// (with more ids than it hints ahead, and fewer).
TEST(RowStoreTest, FindEachAnswersAsFindForEveryId) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  for (int64_t r = 0; r < 40; ++r) {
    store.Add(static_cast<uint64_t>(r) * 7, std::vector<float>{0}, {}, 1);
  }
  for (const size_t count : {size_t{3}, size_t{100}}) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < count; ++i) ids.push_back((count - i) * 5);  // some held, some not
    std::vector<int64_t> rows(ids.size(), -2);
    store.FindEach(ids, rows);
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(rows[i], store.Find(ids[i])) << ids[i];
    if (count == 100) {  // 35, 70, ..., 245 held; the rest not
      EXPECT_EQ(std::count_if(rows.begin(), rows.end(), [](int64_t row) { return row >= 0; }), 7);
    }
  }
}

// Removing a row moves the last row into its place: every other row keeps
// its index, ids still find their rows, a block is freed with its last
// row, and a view frozen before keeps every row it had.
TEST(RowStoreTest, ARemovedRowIsFilledByTheLastAndViewsKeepTheirRows) {
  RowStore store(/*dim=*/2, /*slots_per_value=*/1);
  const int64_t rows = RowStore::kRowsPerBlock + 1;
  for (int64_t r = 0; r < rows; ++r) {
    store.set_tick(r);
    const float v = static_cast<float>(r);
    store.Add(static_cast<uint64_t>(r) + 100, std::vector<float>{v, v}, std::vector<float>{v, -v},
              r + 1);
  }
  const int64_t two_blocks = store.bytes();
  RowStore::Frozen view = store.Freeze();
  store.Remove(3);
  EXPECT_EQ(store.size(), rows - 1);
  EXPECT_EQ(store.Find(103), -1);
  const int64_t last = rows - 1;
  ASSERT_EQ(store.Find(static_cast<uint64_t>(last) + 100), 3);
  EXPECT_EQ(store.values(3)[0], static_cast<float>(last));
  EXPECT_EQ(store.slots(3)[1], -static_cast<float>(last));
  EXPECT_EQ(store.updates(3), last + 1);
  EXPECT_EQ(store.touched(3), last);
  EXPECT_EQ(store.Find(104), 4);
  EXPECT_LT(store.bytes(), two_blocks) << "the emptied block was kept";
  // The view still holds the rows of the freeze, in their places.
  ASSERT_EQ(view.size(), rows);
  EXPECT_EQ(view.id(3), 103u);
  EXPECT_EQ(view.values(3)[0], 3.0f);
  EXPECT_EQ(view.id(last), static_cast<uint64_t>(last) + 100);
  // The last row goes without moving another.
  store.Remove(store.size() - 1);
  EXPECT_EQ(store.size(), rows - 2);
  EXPECT_EQ(store.Find(static_cast<uint64_t>(last - 1) + 100), -1);
  EXPECT_EQ(store.Find(105), 5);
}

TEST(RowStoreTest, MemoryGrowsABlockAtATime) {
  RowStore store(/*dim=*/4, /*slots_per_value=*/0);
  EXPECT_EQ(store.bytes(), 0);
  // Values, id, update count and tick; and the first chunk of block
  // pointers and their change marks (a mark and a bit per row).
  const int64_t block = RowStore::kRowsPerBlock * (4 * 4 + 8 + 8 + 8);
  const int64_t chunk = RowStore::kBlocksPerChunk * static_cast<int64_t>(sizeof(void*) + 8 + 8);
  store.Add(1, std::vector<float>(4), {}, 1);
  EXPECT_GE(store.bytes(), block + chunk);
  EXPECT_LT(store.bytes(), block + chunk + 4096);
  for (uint64_t id = 2; id <= static_cast<uint64_t>(RowStore::kRowsPerBlock); ++id) {
    store.Add(id, std::vector<float>(4), {}, 1);
  }
  const int64_t one_block = store.bytes();
  EXPECT_LT(one_block, 2 * block + chunk);
  store.Add(0, std::vector<float>(4), {}, 1);
  EXPECT_GE(store.bytes(), one_block + block);
}

std::vector<float> Of(std::span<const float> values) { return {values.begin(), values.end()}; }

TEST(RowStoreTest, AFrozenViewKeepsItsRowsWhileTheStoreIsWritten) {
  RowStore store(/*dim=*/2, /*slots_per_value=*/1);
  const int64_t rows = 2 * RowStore::kRowsPerBlock + 3;  // the last block part full
  for (int64_t r = 0; r < rows; ++r) {
    const float v = static_cast<float>(r);
    store.Add(100 + r, std::vector<float>{v, -v}, std::vector<float>{v, v}, 1);
  }
  const RowStore::Frozen view = store.Freeze();
  store.Update(5, std::vector<float>{50, 50}, std::vector<float>{51, 51}, 2);
  store.Update(rows - 1, std::vector<float>{7, 7}, std::vector<float>{7, 7}, 3);
  store.Add(99, std::vector<float>{9, 9}, std::vector<float>{9, 9}, 1);
  EXPECT_EQ(store.size(), rows + 1);
  EXPECT_EQ(Of(store.values(5)), (std::vector<float>{50, 50}));
  EXPECT_EQ(Of(store.slots(5)), (std::vector<float>{51, 51}));
  EXPECT_EQ(store.updates(5), 2);
  EXPECT_EQ(store.updates(rows - 1), 3);
  ASSERT_EQ(view.size(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(r);
    const float v = static_cast<float>(r);
    EXPECT_EQ(view.id(r), static_cast<uint64_t>(100 + r));
    EXPECT_EQ(Of(view.values(r)), (std::vector<float>{v, -v}));
    EXPECT_EQ(Of(view.slots(r)), (std::vector<float>{v, v}));
    EXPECT_EQ(view.updates(r), 1);
  }
}

TEST(RowStoreTest, AViewKeepsItsRowsAcrossChunksWhileTheStoreShrinksAndGrowsPastThem) {
  // The block pointers lie in chunks a view shares: rows in every chunk
  // updated, the last chunk emptied and dropped, then a new one filled.
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  const int64_t rows_per_chunk = RowStore::kRowsPerBlock * RowStore::kBlocksPerChunk;
  const int64_t rows = 2 * rows_per_chunk + 5;  // a third chunk of one block
  for (int64_t r = 0; r < rows; ++r) store.Add(r, std::vector<float>{float(r)}, {}, 1);
  const RowStore::Frozen view = store.Freeze();
  for (int64_t r = 0; r < rows; r += rows_per_chunk / 2) {
    store.Update(r, std::vector<float>{-1}, {}, 2);
  }
  for (int64_t r = 0; r < 6; ++r) store.Remove(store.size() - 1);  // past the third chunk
  ASSERT_EQ(store.size(), 2 * rows_per_chunk - 1);
  std::optional<RowStore::Frozen> middle(store.Freeze());
  for (int64_t r = 0; r < RowStore::kRowsPerBlock + 1; ++r) {
    store.Add(1000000 + r, std::vector<float>{7}, {}, 3);  // a third chunk again
  }
  store.Remove(0);  // the last row, id 1000064, moves to row 0

  ASSERT_EQ(view.size(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (view.id(r) != static_cast<uint64_t>(r) || view.values(r)[0] != float(r) ||
        view.updates(r) != 1) {
      FAIL() << "the first view's row " << r << " changed";
    }
  }
  ASSERT_EQ(middle->size(), 2 * rows_per_chunk - 1);
  EXPECT_EQ(middle->values(0)[0], -1);
  EXPECT_EQ(middle->values(rows_per_chunk)[0], -1);
  EXPECT_EQ(middle->id(2 * rows_per_chunk - 2), 2 * rows_per_chunk - 2);
  middle.reset();

  ASSERT_EQ(store.size(), 2 * rows_per_chunk + RowStore::kRowsPerBlock - 1);
  EXPECT_EQ(store.id(0), 1000000u + RowStore::kRowsPerBlock);
  EXPECT_EQ(store.Find(1000000 + RowStore::kRowsPerBlock), 0);
  EXPECT_EQ(store.values(0)[0], 7);
  EXPECT_EQ(store.values(rows_per_chunk)[0], -1);
  EXPECT_EQ(store.id(2 * rows_per_chunk), 1000001u);
  EXPECT_EQ(store.Find(5), 5);
}

TEST(RowStoreTest, ABlockIsCopiedOnceWhileAViewLivesAndWrittenInPlaceOtherwise) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  store.Add(1, std::vector<float>{1}, {}, 1);
  const float* first = store.values(0).data();
  store.Update(0, std::vector<float>{2}, {}, 2);
  EXPECT_EQ(store.values(0).data(), first);  // no view: in place
  const float* copied = nullptr;
  {
    RowStore::Frozen view = store.Freeze();
    RowStore::Frozen moved = std::move(view);  // still one view
    store.Update(0, std::vector<float>{3}, {}, 3);
    copied = store.values(0).data();
    EXPECT_NE(copied, first);
    store.Update(0, std::vector<float>{4}, {}, 4);
    EXPECT_EQ(store.values(0).data(), copied);  // its own copy now
    EXPECT_EQ(Of(moved.values(0)), std::vector<float>{2});
  }
  store.Freeze();  // dropped at once
  store.Update(0, std::vector<float>{5}, {}, 5);
  EXPECT_EQ(store.values(0).data(), copied);  // no view alive: in place
  EXPECT_EQ(Of(store.values(0)), std::vector<float>{5});
}

TEST(RowStoreTest, AnUpdateInPlaceIsPutBackWholeAndSparesAView) {
  RowStore store(/*dim=*/2, /*slots_per_value=*/1);
  store.Add(1, std::vector<float>{1, 2}, std::vector<float>{3, 4}, 5);
  store.set_tick(7);
  const int64_t tick = store.touched(0);
  std::vector<float> saved(store.saved_floats());
  {
    const RowStore::Frozen view = store.Freeze();
    float* record = store.BeginUpdate(0, saved.data());
    for (int i = 0; i < 4; ++i) record[i] = -record[i];
    store.EndUpdate(0, 6);
    EXPECT_EQ(Of(store.values(0)), (std::vector<float>{-1, -2}));
    EXPECT_EQ(Of(store.slots(0)), (std::vector<float>{-3, -4}));
    EXPECT_EQ(store.updates(0), 6);
    EXPECT_EQ(store.touched(0), 7);
    // The view's block was copied before the write.
    EXPECT_EQ(Of(view.values(0)), (std::vector<float>{1, 2}));
    EXPECT_EQ(view.updates(0), 5);
  }
  store.Restore(0, saved.data());
  EXPECT_EQ(Of(store.values(0)), (std::vector<float>{1, 2}));
  EXPECT_EQ(Of(store.slots(0)), (std::vector<float>{3, 4}));
  EXPECT_EQ(store.updates(0), 5);
  EXPECT_EQ(store.touched(0), tick);
}

// Blocks a view shares outlive the store, and the views frozen after a
// block was replaced never needed it (ASan's build checks the frees).
TEST(RowStoreTest, ViewsKeepTheirBlocksPastTheStoreAndEachOther) {
  std::optional<RowStore::Frozen> first, second;
  {
    RowStore store(/*dim=*/1, /*slots_per_value=*/0);
    const int64_t rows = 3 * RowStore::kRowsPerBlock;
    for (int64_t r = 0; r < rows; ++r) store.Add(r, std::vector<float>{float(r)}, {}, 1);
    first.emplace(store.Freeze());
    store.Update(0, std::vector<float>{-1}, {}, 2);  // block 0 copied; the old one kept
    second.emplace(store.Freeze());
    store.Update(0, std::vector<float>{-2}, {}, 3);  // copied again
    // The last block goes; the views keep it.
    for (int64_t r = 0; r < RowStore::kRowsPerBlock; ++r) store.Remove(store.size() - 1);
    first.reset();  // frees the first copy of block 0, not what `second` holds
    EXPECT_EQ(Of(second->values(0)), std::vector<float>{-1});
  }
  ASSERT_EQ(second->size(), 3 * RowStore::kRowsPerBlock);
  EXPECT_EQ(Of(second->values(0)), std::vector<float>{-1});
  EXPECT_EQ(second->updates(0), 2);
  EXPECT_EQ(Of(second->values(second->size() - 1)), std::vector<float>{float(second->size() - 1)});
}

// As a checkpoint reads it: the view on another thread while the owner
// writes every row, twice, and adds rows.
TEST(RowStoreTest, AViewReadOnAnotherThreadSeesNoWriteAfterTheFreeze) {
  RowStore store(/*dim=*/4, /*slots_per_value=*/1);
  const int64_t rows = 8 * RowStore::kRowsPerBlock + 5;
  for (int64_t r = 0; r < rows; ++r) {
    store.Add(r, std::vector<float>(4, static_cast<float>(r)), std::vector<float>(4, 1), 1);
  }
  std::optional<RowStore::Frozen> view(store.Freeze());
  bool same = true;
  std::thread reader([&] {
    for (int pass = 0; pass < 20; ++pass) {
      for (int64_t r = 0; r < view->size(); ++r) {
        same = same && view->values(r)[3] == static_cast<float>(r) && view->updates(r) == 1;
      }
    }
    view.reset();  // released on the reader's thread, as a checkpoint's
  });
  for (int pass = 2; pass <= 3; ++pass) {
    for (int64_t r = 0; r < rows; ++r) {
      store.Update(r, std::vector<float>(4, -1.0f), std::vector<float>(4, 2), pass);
    }
  }
  for (int64_t r = 0; r < RowStore::kRowsPerBlock; ++r) {
    store.Add(rows + r, std::vector<float>(4), std::vector<float>(4), 1);
  }
  reader.join();
  EXPECT_TRUE(same);
  EXPECT_EQ(store.updates(rows - 1), 3);
  EXPECT_EQ(store.values(rows - 1)[0], -1.0f);
}

std::vector<uint64_t> MarkedIds(const RowStore::Frozen& view, int64_t mark) {
  std::vector<uint64_t> ids;
  view.ForEachMarked(mark, [&](int64_t row) { ids.push_back(view.id(row)); });
  return ids;
}

// What a delta checkpoint finds: the rows written under the mark a
// capture ended, wherever they are at the freeze, across blocks and
// chunks; the rows written after it are the next mark's.
TEST(RowStoreTest, AViewListsTheRowsWrittenUnderAMarkWhereverTheyMoved) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/1);
  store.EndChanges();  // the marks start
  const int64_t rows = (RowStore::kBlocksPerChunk + 1) * RowStore::kRowsPerBlock;
  for (int64_t r = 0; r < rows; ++r) {
    store.Add(static_cast<uint64_t>(r), std::vector<float>{0}, std::vector<float>{0}, 0);
  }
  const int64_t adds = store.EndChanges();
  std::vector<float> saved(store.saved_floats());
  store.Update(3, std::vector<float>{1}, std::vector<float>{1}, 1);
  store.BeginUpdate(rows - 2, saved.data())[0] = 1;
  store.EndUpdate(rows - 2, 1);
  // The last row was written; removing row 5 moves it there.
  store.Update(rows - 1, std::vector<float>{1}, std::vector<float>{1}, 1);
  store.Remove(5);
  store.Add(1000000, std::vector<float>{1}, std::vector<float>{1}, 1);
  const RowStore::Frozen view = store.Freeze();
  const int64_t mark = store.EndChanges();
  EXPECT_EQ(mark, adds + 1);
  store.Update(7, std::vector<float>{2}, std::vector<float>{2}, 2);  // the next mark's
  EXPECT_EQ(MarkedIds(view, mark),
            (std::vector<uint64_t>{3, static_cast<uint64_t>(rows - 1),
                                   static_cast<uint64_t>(rows - 2), 1000000}));
  // Of the mark before, the blocks written since keep nothing: all rows
  // but those of the first block and the last.
  EXPECT_EQ(MarkedIds(view, adds).size(), static_cast<size_t>(rows - 2 * RowStore::kRowsPerBlock));
  const RowStore::Frozen next = store.Freeze();
  EXPECT_EQ(MarkedIds(next, store.EndChanges()), std::vector<uint64_t>{7});
}

// Until a delta first asks, writes mark nothing.
TEST(RowStoreTest, AStoreMarksNoRowBeforeTheFirstEndOfChanges) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  store.Add(9, std::vector<float>{1}, {}, 1);
  store.Update(0, std::vector<float>{2}, {}, 2);
  const RowStore::Frozen view = store.Freeze();
  EXPECT_EQ(MarkedIds(view, store.EndChanges()), std::vector<uint64_t>{});
  store.Update(0, std::vector<float>{3}, {}, 3);
  const RowStore::Frozen next = store.Freeze();
  EXPECT_EQ(MarkedIds(next, store.EndChanges()), std::vector<uint64_t>{9});
}

// A row written again under the same mark is not marked again (its tick
// says so), and one written under the next mark is, whichever way the
// ticks have gone.
TEST(RowStoreTest, ARowsTickTellsWhetherItsWriteIsMarkedAlready) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  store.set_tick(1);
  for (uint64_t id = 0; id < 4; ++id) store.Add(id, std::vector<float>{1}, {}, 1);
  store.EndChanges();
  std::vector<float> saved(store.saved_floats());
  store.set_tick(2);
  store.BeginUpdate(1, saved.data())[0] = 2;
  store.EndUpdate(1, 2);
  store.set_tick(3);
  store.Update(1, std::vector<float>{3}, {}, 3);
  store.Update(2, std::vector<float>{3}, {}, 2);
  const RowStore::Frozen first = store.Freeze();
  EXPECT_EQ(MarkedIds(first, store.EndChanges()), (std::vector<uint64_t>{1, 2}));
  store.Update(1, std::vector<float>{4}, {}, 4);  // at tick 3 still
  store.set_tick(10);
  store.Update(3, std::vector<float>{4}, {}, 2);
  const RowStore::Frozen second = store.Freeze();
  EXPECT_EQ(MarkedIds(second, store.EndChanges()), (std::vector<uint64_t>{1, 3}));
  store.set_tick(5);  // back: rows written at 10 are marked again all the same
  store.Update(3, std::vector<float>{5}, {}, 3);
  store.Update(0, std::vector<float>{5}, {}, 2);
  const RowStore::Frozen third = store.Freeze();
  EXPECT_EQ(MarkedIds(third, store.EndChanges()), (std::vector<uint64_t>{0, 3}));
}

// A row written and put back (a discarded update) is listed too: its
// place was written, and a set of changed ids tells the rest.
TEST(RowStoreTest, ARowPutBackIsListedUnderTheMarkOfItsWrite) {
  RowStore store(/*dim=*/1, /*slots_per_value=*/0);
  store.Add(9, std::vector<float>{1}, {}, 1);
  store.Add(10, std::vector<float>{1}, {}, 1);
  store.EndChanges();  // the marks start
  std::vector<float> saved(store.saved_floats());
  store.BeginUpdate(1, saved.data())[0] = 5;
  store.Restore(1, saved.data());
  const RowStore::Frozen view = store.Freeze();
  EXPECT_EQ(MarkedIds(view, store.EndChanges()), std::vector<uint64_t>{10});
}

}  // namespace PST_FILE_ID
}  // namespace pst
